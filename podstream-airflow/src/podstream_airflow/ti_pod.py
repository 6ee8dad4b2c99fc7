"""The sink's record of each TI's pod in the metadata DB (its ``podstream_ti_pod`` table),
as adoption reads it: which pods podstream last saw alive. The executor adopts by it, and
``airflow podstream check`` checks that Airflow's role may read it."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from airflow import settings
from sqlalchemy import bindparam, text
from sqlalchemy.exc import SQLAlchemyError

#: The commands after which podstream's record says a TI's pod is alive.
ALIVE_AFTER = ("running", "transfer")
#: The sink's table of each TI's pod, and the columns adoption reads of it.
TI_POD_TABLE = "podstream_ti_pod"
TI_POD_COLUMNS = ("dag_id", "task_id", "run_id", "map_index", "try_number", "pod_namespace", "pod_name")


def live_pods(tis: Sequence[Any]) -> list:
    """(namespace, name) of each TI's pod that podstream's sink last recorded alive, from its
    ``podstream_ti_pod`` table in the metadata DB (none where the table is not there)."""
    wanted = {(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, ti.try_number) for ti in tis}
    if not wanted:
        return []
    dag_ids = sorted({key[0] for key in wanted})
    statement = text(
        f"SELECT {', '.join(TI_POD_COLUMNS)} "
        f"FROM {TI_POD_TABLE} WHERE last_command IN :alive AND dag_id IN :dag_ids"
    ).bindparams(bindparam("alive", expanding=True), bindparam("dag_ids", expanding=True))
    try:
        # A connection of its own: the scheduler's session holds the TIs being adopted, and
        # closing it (as a `create_session` block does) would detach them.
        if settings.engine is None:
            raise SQLAlchemyError("Airflow has no database engine configured")
        with settings.engine.connect() as connection:
            rows = connection.execute(statement, {"alive": list(ALIVE_AFTER), "dag_ids": dag_ids}).fetchall()
    except SQLAlchemyError as error:
        # A missing grant (docs/install.md) makes adoption fall back to labels: say so loudly.
        logging.getLogger(__name__).warning(
            "podstream: no record of pods to adopt by (%s); adopting by labels only", type(error).__name__
        )
        return []
    return [(row[5], row[6]) for row in rows if tuple(row[:5]) in wanted]
