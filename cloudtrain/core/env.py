"""Every `CLOUDTRAIN_*` environment variable, declared once, and the only place that reads them.

Each variable is a `Var`: its name, its type (str, int, float, bool, path, json), who reads it
(the controller, the node agent, the user's job process, the node's bootstrap script), whether
only tests set it, whether it is a deprecated fallback of a provider option, its default and a
one-line meaning. `VARS` is the table; `table_markdown()` draws it for ARCHITECTURE.md
(`python -m cloudtrain.core.env`).

Code reads a variable through its declaration only: `HOME.get()` (the typed value, or None when
unset or blank; ValueError for a value of the wrong type), `HOME.text()` (the stripped text, ""
when unset) or `HOME.raw()` (exactly what the environment holds, None when unset), each from
`os.environ` or from a given mapping. Code that sets a variable for another process uses
`VAR.name` as the key. Callers keep their own rules and error lines for a bad value (a range, a
pattern): the declaration says what the value is, the caller what it may be.
tests/unit/core/test_env.py fails on a module that names a `CLOUDTRAIN_*` variable itself.

Node-side: the standard library only, Python 3.10+; imports nothing of cloudtrain.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "CLOUDTRAIN_"  # every variable's; the spec's env may set none of them (jobs/node_rules)

TYPES = ("str", "int", "float", "bool", "path", "json")

# who reads a variable
CONTROLLER = "controller"  # the CLI/API process, and the controller node of a detached run
AGENT = "node agent"  # jobs/agent.py and what it runs in its process
JOB = "job process"  # the user's training process (jobs/runtime.py, jobs/horovod.py)
BOOTSTRAP = "bootstrap script"  # the node's startup script (providers' metadata blocks)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Var:
    """One `CLOUDTRAIN_*` variable. `readers` are the processes that read it; `set_by` who sets
    it where that is not the user (e.g. the agent, for the job); `deprecated` names the provider
    option that replaces it (read only through cloudtrain/jobspec/provider_config.py)."""

    name: str
    type: str
    readers: tuple[str, ...]
    meaning: str
    default: str = ""
    test_only: bool = False
    deprecated: str = ""
    set_by: str = ""

    def __post_init__(self) -> None:
        if not self.name.startswith(PREFIX) or self.type not in TYPES:
            raise ValueError(f"bad declaration of {self.name!r} ({self.type!r})")

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The value exactly as set in `environ` (default os.environ), or None when unset."""
        return (os.environ if environ is None else environ).get(self.name)

    def text(self, environ: Mapping[str, str] | None = None) -> str:
        """The value with surrounding blanks stripped; "" when unset. Pure but for reading."""
        return (self.raw(environ) or "").strip()

    def get(self, environ: Mapping[str, str] | None = None) -> Any:
        """The typed value, or None when unset or blank. Raises ValueError for a value that is
        not of the declared type (an int, a float, a bool as 1/0/true/false, JSON)."""
        value = self.text(environ)
        return parse(self.type, value) if value else None


def parse(kind: str, value: str) -> Any:
    """`value` (non-blank, stripped) as a `kind` of TYPES. Pure; ValueError when it is not."""
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool":
        if value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ValueError(f"{value!r} is not a bool (1/0, true/false)")
    if kind == "path":
        return Path(value).expanduser()
    if kind == "json":
        return json.loads(value)
    return value


# --- where cloudtrain keeps state, and the controller's knobs -----------------------------------
HOME = Var(
    "CLOUDTRAIN_HOME", "path", (CONTROLLER,),
    "cloudtrain's local state: the ledger, runs' folders, config.yaml, catalog overrides",
    default="~/.cloudtrain",
)  # fmt: skip
HEARTBEAT_TIMEOUT = Var(
    "CLOUDTRAIN_HEARTBEAT_TIMEOUT_S", "float", (CONTROLLER,),
    "seconds a node the cloud still lists may go without a heartbeat before it counts as lost"
    " (at least 10)",
    default="180 (local: 60)",
)  # fmt: skip
LOCAL_PRICE = Var(
    "CLOUDTRAIN_LOCAL_PRICE_USD", "float", (CONTROLLER,),
    "the local provider's price, USD per node-hour, in plans and cost reports",
    default="the catalog's (0)",
)  # fmt: skip
LOCAL_PORTS = Var(
    "CLOUDTRAIN_LOCAL_PORTS", "str", (CONTROLLER,),
    "LOW-HIGH: the range the local provider draws its nodes' ports from",
    default="20000 up to the kernel's ephemeral range",
)  # fmt: skip
GCP_PRICING_KEY = Var(
    "CLOUDTRAIN_GCP_PRICING_KEY", "str", (CONTROLLER,),
    "API key for the Cloud Billing Catalog API (`cloudtrain catalog refresh gcp`)",
    default="ADC",
)  # fmt: skip
WHEELHOUSE_TAG = Var(
    "CLOUDTRAIN_WHEELHOUSE_TAG", "str", (CONTROLLER,),
    "the nodes' wheelhouse tag where the controller cannot know it (an unknown image)",
)  # fmt: skip
TRANSFER_PART_BYTES = Var(
    "CLOUDTRAIN_TRANSFER_PART_BYTES", "int", (CONTROLLER, AGENT),
    "the part size of multipart transfers, in bytes",
    default="8 MiB",
)  # fmt: skip
TRANSFER_DIR = Var(
    "CLOUDTRAIN_TRANSFER_DIR", "path", (CONTROLLER, AGENT),
    "the folder of interrupted transfers' resume state",
    default="<tempdir>/cloudtrain-transfers",
)  # fmt: skip

# --- deprecated: provider options' old variables (providers.<cloud>.<option> replaces each) ------
SSH_CIDR = Var(
    "CLOUDTRAIN_SSH_CIDR", "str", (CONTROLLER,),
    "the CIDR allowed to reach the nodes' SSH port",
    deprecated="providers.<cloud>.ssh_cidr",
)  # fmt: skip
GCP_NETWORK = Var(
    "CLOUDTRAIN_GCP_NETWORK", "str", (CONTROLLER,),
    "the existing VPC network GCP runs use",
    default="default", deprecated="providers.gcp.network",
)  # fmt: skip
GCP_SERVICE_ACCOUNT = Var(
    "CLOUDTRAIN_GCP_SERVICE_ACCOUNT", "str", (CONTROLLER,),
    "the service account GCP nodes run as",
    default="one made per run", deprecated="providers.gcp.service_account",
)  # fmt: skip
GCP_SIGNER = Var(
    "CLOUDTRAIN_GCP_SIGNER", "str", (CONTROLLER,),
    "the service account that signs GCS URLs",
    deprecated="providers.gcp.signer",
)  # fmt: skip
AZURE_RESOURCE_GROUP = Var(
    "CLOUDTRAIN_AZURE_RESOURCE_GROUP", "str", (CONTROLLER,),
    "an existing resource group Azure runs use",
    default="one group per run", deprecated="providers.azure.resource_group",
)  # fmt: skip
AZURE_STORAGE_ACCOUNT = Var(
    "CLOUDTRAIN_AZURE_STORAGE_ACCOUNT", "str", (CONTROLLER,),
    "the storage account holding Azure runs' containers",
    default="one made per region", deprecated="providers.azure.storage_account",
)  # fmt: skip

# --- set by the node agent for the job's process (jobs/agent.py), read by jobs/runtime.py --------
RUN_ID = Var("CLOUDTRAIN_RUN_ID", "str", (JOB,), "the run's id", set_by=AGENT)
STRATEGY = Var(
    "CLOUDTRAIN_STRATEGY", "str", (JOB,), "the run's distribution strategy",
    default="inferred from TF_CONFIG", set_by=AGENT,
)  # fmt: skip
ROLE = Var(
    "CLOUDTRAIN_ROLE", "str", (JOB,), "this task's role (chief, worker, ps, evaluator)",
    default="TF_CONFIG's task, else chief", set_by=AGENT,
)  # fmt: skip
INDEX = Var(
    "CLOUDTRAIN_INDEX", "int", (JOB,), "this task's index within its role",
    default="0", set_by=AGENT,
)  # fmt: skip
IS_CHIEF = Var(
    "CLOUDTRAIN_IS_CHIEF", "bool", (JOB,), "1 on the task whose outputs matter, else 0",
    default="derived from TF_CONFIG", set_by=f"{AGENT}; Horovod's launcher per rank",
)  # fmt: skip
ATTEMPT = Var(
    "CLOUDTRAIN_ATTEMPT", "int", (JOB,), "which attempt of the run this process belongs to",
    set_by=AGENT,
)  # fmt: skip
CHECKPOINT_DIR = Var(
    "CLOUDTRAIN_CHECKPOINT_DIR", "path", (JOB,),
    "where the job writes checkpoints (the agent syncs and restores them)",
    default="./checkpoints", set_by=AGENT,
)  # fmt: skip
MODEL_DIR = Var(
    "CLOUDTRAIN_MODEL_DIR", "path", (JOB,), "where the chief saves the model (uploaded)",
    default="./model", set_by=AGENT,
)  # fmt: skip
TENSORBOARD_DIR = Var(
    "CLOUDTRAIN_TENSORBOARD_DIR", "path", (JOB,),
    "the chief's TensorBoard event files' folder (mirrored to the bucket)",
    default="./tensorboard", set_by=AGENT,
)  # fmt: skip
METRICS_FILE = Var(
    "CLOUDTRAIN_METRICS_FILE", "path", (JOB,),
    "the file the job's callbacks append METRICS records to (jobs/protocol.py)",
    set_by=AGENT,
)  # fmt: skip
MAX_STEPS = Var(
    "CLOUDTRAIN_MAX_STEPS", "int", (JOB,), "fit() stops after this many steps",
    set_by="`cloudtrain scale` (exported in the entrypoint)",
)  # fmt: skip

# --- the node's address ----------------------------------------------------------------------
NODE_HOST = Var(
    "CLOUDTRAIN_NODE_HOST", "str", (AGENT, BOOTSTRAP),
    "the address this node registers for the rendezvous",
    default="the metadata service's, else the default route's interface",
    set_by="the local provider; else the bootstrap script",
)  # fmt: skip
NODE_PORT = Var(
    "CLOUDTRAIN_NODE_PORT", "int", (AGENT, BOOTSTRAP),
    "the port this node registers for the rendezvous",
    default="the job's port", set_by="the local provider",
)  # fmt: skip
NODE_NAME = Var(
    "CLOUDTRAIN_NODE_NAME", "str", (),
    "a local node's name, in its processes' environment (nothing of cloudtrain reads it)",
    set_by="the local provider",
)  # fmt: skip
LOCAL_NODE = Var(
    "CLOUDTRAIN_LOCAL_NODE", "str", (CONTROLLER,),
    "a local node's processes' marker, found in /proc/PID/environ to end them",
    set_by="the local provider",
)  # fmt: skip

# --- test-only: fakes' endpoints, crash points, faults ------------------------------------------
CRASH_AT = Var(
    "CLOUDTRAIN_CRASH_AT", "str", (CONTROLLER,),
    "the crash point (cloudtrain/core/crashpoints.py) where the process SIGKILLs itself",
    test_only=True,
)  # fmt: skip
FAULTS = Var(
    "CLOUDTRAIN_FAULTS", "json", (CONTROLLER,),
    "a fault plan (latency, error rate) wrapped around every provider call",
    test_only=True,
)  # fmt: skip
LEASE_TTL = Var(
    "CLOUDTRAIN_LEASE_TTL_S", "float", (CONTROLLER,),
    "the run lease's ttl in seconds (at least 1)",
    default="30", test_only=True,
)  # fmt: skip
METADATA_URL = Var(
    "CLOUDTRAIN_METADATA_URL", "str", (AGENT,),
    "the preemption watcher's metadata service (a fake)",
    default="the cloud's metadata address", test_only=True,
)  # fmt: skip
AZURE_IMDS = Var(
    "CLOUDTRAIN_AZURE_IMDS", "str", (BOOTSTRAP,),
    "the Azure Instance Metadata Service's address",
    default="http://169.254.169.254", test_only=True,
)  # fmt: skip
ARM_ENDPOINT = Var(
    "CLOUDTRAIN_ARM_ENDPOINT", "str", (CONTROLLER,),
    "the Azure Resource Manager fake's endpoint (with an offline token)",
    test_only=True,
)  # fmt: skip
ARM_CA = Var(
    "CLOUDTRAIN_ARM_CA", "path", (CONTROLLER,),
    "the CA that signs the ARM fake's certificate",
    test_only=True,
)  # fmt: skip
AZURE_BLOB_ENDPOINT = Var(
    "CLOUDTRAIN_AZURE_BLOB_ENDPOINT", "str", (CONTROLLER, AGENT),
    "the Blob Storage front of the test box (https://host:port)",
    test_only=True,
)  # fmt: skip
GCE_ENDPOINT = Var(
    "CLOUDTRAIN_GCE_ENDPOINT", "str", (CONTROLLER,),
    "the Compute Engine fake's endpoint (anonymous credentials)",
    test_only=True,
)  # fmt: skip
TPU_ENDPOINT = Var(
    "CLOUDTRAIN_TPU_ENDPOINT", "str", (CONTROLLER,),
    "the Cloud TPU API fake's endpoint (anonymous credentials; with CLOUDTRAIN_GCE_ENDPOINT)",
    test_only=True,
)  # fmt: skip
IAM_ENDPOINT = Var(
    "CLOUDTRAIN_IAM_ENDPOINT", "str", (CONTROLLER,),
    "the IAM fake's endpoint (anonymous credentials); also CRM's and Service Usage's when unset",
    test_only=True,
)  # fmt: skip
CRM_ENDPOINT = Var(
    "CLOUDTRAIN_CRM_ENDPOINT", "str", (CONTROLLER,),
    "the Cloud Resource Manager fake's endpoint",
    default="CLOUDTRAIN_IAM_ENDPOINT", test_only=True,
)  # fmt: skip
SERVICEUSAGE_ENDPOINT = Var(
    "CLOUDTRAIN_SERVICEUSAGE_ENDPOINT", "str", (CONTROLLER,),
    "the Service Usage fake's endpoint",
    default="CLOUDTRAIN_IAM_ENDPOINT", test_only=True,
)  # fmt: skip
PRICING_GCP_URL = Var(
    "CLOUDTRAIN_PRICING_GCP_URL", "str", (CONTROLLER,),
    "the Cloud Billing Catalog API's base URL (a fake)",
    default="https://cloudbilling.googleapis.com", test_only=True,
)  # fmt: skip
PRICING_AZURE_URL = Var(
    "CLOUDTRAIN_PRICING_AZURE_URL", "str", (CONTROLLER,),
    "the Azure Retail Prices API's base URL (a fake)",
    default="https://prices.azure.com", test_only=True,
)  # fmt: skip

VARS: tuple[Var, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Var))
_BY_NAME: dict[str, Var] = {v.name: v for v in VARS}


def by_name(name: str) -> Var:
    """The declaration of `name`. Raises KeyError for a name not declared here. Pure."""
    return _BY_NAME[name]


def table_markdown() -> str:
    """The variables as a markdown table (name, type, read by, test-only, meaning), in
    declaration order, for ARCHITECTURE.md. Pure."""
    rows = [
        "| Variable | Type | Read by | Test-only | Meaning |",
        "|---|---|---|---|---|",
    ]
    for var in VARS:
        meaning = var.meaning
        if var.default:
            meaning += f" (default: {var.default})"
        if var.set_by:
            meaning += f"; set by {var.set_by}"
        if var.deprecated:
            meaning = f"deprecated, use `{var.deprecated}`: {meaning}"
        readers = ", ".join(var.readers) or "-"
        test_only = "yes" if var.test_only else ""
        rows.append(f"| `{var.name}` | {var.type} | {readers} | {test_only} | {meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table_markdown(), end="")
