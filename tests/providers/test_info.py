"""Every registered provider declares itself completely (providers/README.md's checklist): its
INFO, the same module names in every cloud package, a light `__init__`, and a node-side
preemption probe of the standard library only."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.providers import REGISTERED, info, info_for_uri, names

ROOT = Path(__file__).resolve().parents[2]
# the modules every cloud package has, each with the same job (providers/README.md)
CLOUD_MODULES = frozenset(
    {
        "provider",  # the Provider class INFO.adapter names
        "clients",  # SDK clients, credentials, endpoints
        "errors",  # SDK exceptions -> cloudtrain errors, with codes
        "bodies",  # request bodies and reading them back (pure)
        "compute",  # the Compute
        "network",  # the run's firewall / security group / network
        "identity",  # the run's (or node's) cloud identity and its grants
        "storage",  # the ObjectStore
        "images",  # machine images
        "preemption",  # the node-side probe (INFO.preemption)
        "pricing",  # the price client (INFO.pricing)
        "catalog_rules",  # the catalog's rules (INFO.catalog_rules)
        "options",  # the typed options model (INFO.options)
    }
)
# what a provider package without a cloud SDK (slurm: a cluster's own commands) has at least
PACKAGE_MODULES = frozenset({"provider", "compute", "storage", "options"})
SDKS = ("boto3", "botocore", "google.cloud", "google.auth", "azure.", "pydantic")
# what a probe may import besides the standard library
PROBE_IMPORTS = ("cloudtrain.providers.metadata", "cloudtrain.providers.registry")


def _folder(name: str) -> Path:
    module = REGISTERED[name]
    return ROOT / "providers" / module.rsplit(".", 1)[1]


def _refs(name: str) -> dict[str, str]:
    found = info(name)
    fields = ("adapter", "options", "preemption", "pricing", "catalog_rules", "tpu_types")
    return {f: getattr(found, f) for f in fields if getattr(found, f)}


@pytest.mark.parametrize("name", names())
def test_info_is_complete_and_every_reference_exists(name: str) -> None:
    found = info(name)
    assert found.name == name
    assert found.scheme and found.adapter
    assert found.account_field in (None, "project", "subscription")
    assert found.inventory_scope in ("region", "account")
    assert found.storage_usd_per_gb_month >= 0
    assert (found.extra is None) == (found.sdk_module is None)
    for field, ref in _refs(name).items():
        module = ref.partition(":")[0]
        assert importlib.util.find_spec(module) is not None, f"{name} INFO.{field}: {ref}"
    assert info_for_uri(f"{found.scheme}://bucket/prefix") is found


def test_schemes_are_unique() -> None:
    schemes = [info(n).scheme for n in names()]
    assert len(schemes) == len(set(schemes)), schemes


@pytest.mark.parametrize("name", [n for n in names() if _folder(n).is_dir()])
def test_every_cloud_package_has_the_same_module_names(name: str) -> None:
    present = {p.stem for p in _folder(name).glob("*.py")}
    needed = CLOUD_MODULES if info(name).extra else PACKAGE_MODULES  # a cloud: its SDK's extra
    assert needed - present == set(), f"providers/{name} lacks these modules"


@pytest.mark.parametrize("name", [n for n in names() if info(n).preemption])
def test_the_preemption_probe_is_standard_library_only(name: str) -> None:
    ref = info(name).preemption
    assert ref is not None
    spec = importlib.util.find_spec(ref.partition(":")[0])
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    stdlib = sys.stdlib_module_names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported = [node.module or ""]
        else:
            continue
        for module in imported:
            top = module.split(".")[0]
            assert top in stdlib or module in PROBE_IMPORTS, f"{ref} imports {module}"


def test_reading_every_info_loads_no_sdk() -> None:
    code = (
        "import json, sys\n"
        "from cloudtrain.providers import info, info_for_uri, names\n"
        "for n in names():\n"
        "    info_for_uri(info(n).scheme + '://b/p')\n"
        f"print(json.dumps([m for m in sys.modules if m.startswith({SDKS!r})]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == []
