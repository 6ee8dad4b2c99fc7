"""podstream's executor as the stories run it: the shipped ``PodstreamKubernetesExecutor`` and
one hold for story (h), which the package itself does not ship.

When a file ``hold`` is in the folder $PODSTREAM_TEST_HOLD_AFTER_TAKING as a fail enters the
executor, the file is removed, ``taken`` written beside it, and the scheduler loop held there
for good: the story kills the scheduler after its executor took the fail and before its loop
committed what the fail did."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from podstream_airflow import PodstreamKubernetesExecutor

#: The folder the story asks for the hold in.
HOLD_AFTER_TAKING_ENV = "PODSTREAM_TEST_HOLD_AFTER_TAKING"


class StoryPodstreamKubernetesExecutor(PodstreamKubernetesExecutor):
    """``PodstreamKubernetesExecutor`` that holds its loop once after taking a fail, when asked."""

    def take_command(self, delivery: Any) -> Optional[Any]:
        event = super().take_command(delivery)
        # A KubernetesWatch: (pod name, namespace, state, annotations, resource version, ...).
        if event is not None and event[2] == "failed":
            hold_if_asked(self.log)
        return event


def hold_if_asked(log: Any) -> None:
    """Holds the scheduler loop for good, once, when the story asked for it."""
    folder = os.environ.get(HOLD_AFTER_TAKING_ENV)
    if not folder:
        return
    try:
        os.remove(os.path.join(folder, "hold"))
    except FileNotFoundError:
        return
    log.warning("podstream story: holding the scheduler loop after taking a fail (%s)", HOLD_AFTER_TAKING_ENV)
    with open(os.path.join(folder, "taken"), "w") as taken:
        taken.write("taken\n")
    while True:
        time.sleep(3600)
