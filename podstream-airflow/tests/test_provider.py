"""The package as an Airflow provider: installed as a wheel (not editable) by podstream's
setup, Airflow's own provider manager lists it, and its configuration knows the ``[podstream]``
section with the package's defaults."""

from __future__ import annotations

import pytest

from podstream_airflow.config import DEFAULT_URL, OPTIONS, SECTION, PodstreamConfig
from podstream_airflow.provider_info import PACKAGE, get_provider_info


def test_airflows_provider_manager_lists_the_package_and_its_executor():
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert PACKAGE in manager.providers, sorted(manager.providers)
    info = manager.providers[PACKAGE].data
    assert info["executors"] == ["podstream_airflow.PodstreamKubernetesExecutor"]


def test_the_provider_info_passes_airflows_own_schema():
    import json
    from importlib.resources import files

    import jsonschema

    schema = json.loads((files("airflow") / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_airflows_configuration_knows_every_key_with_the_packages_default():
    from airflow.configuration import conf
    from airflow.providers_manager import ProvidersManager

    # As Airflow's own start-up does (settings.initialize), once providers are discovered.
    ProvidersManager().initialize_providers_configuration()
    conf.load_providers_configuration()
    for option in OPTIONS:
        assert conf.get(SECTION, option.key, fallback=None) in (option.default, None, ""), option.key
    assert conf.get(SECTION, "url") == DEFAULT_URL
    # An unset key reads as unset, not as a string Airflow made of the default.
    config = PodstreamConfig.from_airflow("7")
    assert config.consumer == "podstream-airflow-7"
    assert config.servers == (DEFAULT_URL,)


@pytest.mark.parametrize("key", [option.key for option in OPTIONS])
def test_every_key_is_documented_in_the_module(key):
    import podstream_airflow.config as module

    assert f"``{key}``" in (module.__doc__ or ""), key


def test_the_distribution_declares_python_license_and_urls():
    from importlib.metadata import distribution

    meta = distribution(PACKAGE).metadata
    assert meta["Requires-Python"] == ">=3.10"
    # PEP 639: an SPDX expression and the license text shipped, no license classifier.
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])
    assert not [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    urls = dict(entry.split(", ", 1) for entry in meta.get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues"}, urls
    assert all(url.startswith("https://") for url in urls.values()), urls


def test_the_provider_info_names_its_integration_and_operator_modules():
    import importlib
    import inspect

    from podstream_airflow.provider_info import INTEGRATION, project_url

    try:  # Airflow 3
        from airflow.sdk import BaseOperator
    except ImportError:  # Airflow 2
        from airflow.models.baseoperator import BaseOperator  # type: ignore[no-redef]

    info = get_provider_info()
    assert [i["integration-name"] for i in info["integrations"]] == [INTEGRATION]
    assert info["integrations"][0]["external-doc-url"] == project_url("Documentation") != ""
    for entry in info["operators"]:
        assert entry["integration-name"] == INTEGRATION
        for name in entry["python-modules"]:
            module = importlib.import_module(name)
            operators = [
                cls
                for cls in vars(module).values()
                if inspect.isclass(cls) and issubclass(cls, BaseOperator) and cls.__module__ == name
            ]
            assert operators, f"{name} defines no operator"


def test_the_package_ships_no_test_hook():
    from importlib.resources import files

    package = files("podstream_airflow")
    for source in package.iterdir():
        if source.name.endswith(".py"):
            text = source.read_text()
            assert "PODSTREAM_TEST" not in text, source.name
