"""The provider registry: lazy imports and one-line errors for what is not installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cloudtrain import providers
from cloudtrain.core.errors import UsageError
from cloudtrain.providers.info import ProviderInfo


def test_a_missing_sdk_names_the_pip_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        providers._EXTRA,
        "fakecloud",
        ProviderInfo(
            name="fakecloud",
            scheme="fake",
            adapter="cloudtrain.providers.local:LocalProvider",
            extra="fakecloud",
            sdk_module="no_such_sdk_module_xyz",
        ),
    )
    with pytest.raises(UsageError) as info:
        providers.get_provider("fakecloud")
    assert info.value.hint == "pip install 'cloudtrain[fakecloud]'"


def test_a_provider_not_in_this_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        providers._EXTRA,
        "later",
        ProviderInfo(name="later", scheme="later", adapter="cloudtrain.providers.no_such_module:X"),
    )
    with pytest.raises(UsageError, match="not available in this version"):
        providers.get_provider("later")


def test_unknown_provider_and_uri_scheme() -> None:
    with pytest.raises(UsageError, match="known providers: local, aws"):
        providers.get_provider("openstack")
    with pytest.raises(UsageError, match="unsupported storage URI"):
        providers.open_store("ftp://x/y")
    assert providers.provider_for_uri("s3://b/p") == "aws"


def test_gcp_is_available_and_reads_no_credentials_to_build() -> None:
    gcp = providers.get_provider("gcp")  # what a node's agent does to open its store
    assert gcp.name == "gcp"
    assert providers.provider_for_uri("gs://b/p") == "gcp"
    assert providers.open_store("gs://cloudtrain-b/p").uri == "gs://cloudtrain-b/p"


def test_lazy_import() -> None:
    for name in [m for m in sys.modules if m.startswith("cloudtrain.providers.aws")]:
        del sys.modules[name]
    providers.get_provider("local")
    assert "cloudtrain.providers.aws" not in sys.modules


def test_the_registry_wraps_each_provider_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from cloudtrain.providers.faults import FaultyProvider
    from cloudtrain.providers.retrying import RetryingProvider, RetryingStore

    monkeypatch.delenv("CLOUDTRAIN_FAULTS", raising=False)
    plain = providers.get_provider("local")
    assert isinstance(plain, RetryingProvider) and not isinstance(plain.inner, FaultyProvider)
    assert isinstance(providers.open_store(f"file://{tmp_path}/bucket"), RetryingStore)
    monkeypatch.setenv("CLOUDTRAIN_FAULTS", '{"latency_s": 0}')
    faulty = providers.get_provider("local")  # faults inside, the retry layer outside
    assert isinstance(faulty, RetryingProvider) and isinstance(faulty.inner, FaultyProvider)
    assert providers.info_for_uri("s3://b/p").name == "aws"
