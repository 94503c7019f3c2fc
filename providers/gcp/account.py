"""GCP's AccountProbe: the caller's project asked, read-only, before a run creates anything.

- `credentials()`: the link of Application Default Credentials that `google.auth.default()`
  took, in its own order (google-auth's `_default.default`: the GOOGLE_APPLICATION_CREDENTIALS
  file, gcloud's application-default credentials file, App Engine, the metadata server), its
  service account's email where the credentials know one, and the project (clients.py's
  order: the spec, the environment, ADC). On the box (CLOUDTRAIN_GCE_ENDPOINT) the caller is
  anonymous.
- `apis()`: each API a run calls (`RUN_APIS`; a TPU run's `TPU_API` too), asked of Service Usage v1
  (`GET https://serviceusage.googleapis.com/v1/projects/{p}/services/{name}` -> `state`
  ENABLED or DISABLED; cloud.google.com/service-usage/docs/reference/rest/v1/services/get).
- `missing_rights()`: `controller_identity.RUN_PERMISSIONS` (the one list of what a run uses;
  a TPU run's `TPU_PERMISSIONS` too) less what Resource Manager's `projects.testIamPermissions`
  says the caller holds
  (`POST https://cloudresourcemanager.googleapis.com/v1/projects/{p}:testIamPermissions`;
  cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions: "There are
  no permissions required for making this API call"; the probe sends at most 100 a call).
- `quotas(region, needs)`: the region's `quotas[]` (Compute `regions.get`) and the project's
  (`projects.get`: GPUS_ALL_REGIONS, where the project has it). A need counts its GPUs against
  the model's metric (`GPU_METRICS`: google-cloud-compute's `Quota.Metric` enum) and its vCPUs
  against its family's metric (A2_CPUS, N2_CPUS, ...) or CPUS; a Spot need against the
  PREEMPTIBLE_ twin where the project was granted it (limit above 0), else against the regular
  one ("consider requesting preemptible quota for Spot VMs" so they do not consume standard
  quota: docs.cloud.google.com/compute/docs/instances/create-use-spot). A metric the region
  does not list is a limit of 0 (the region has none of it).

CLOUDTRAIN_CRM_ENDPOINT and CLOUDTRAIN_SERVICEUSAGE_ENDPOINT (each else CLOUDTRAIN_IAM_ENDPOINT,
which the box serves all from) point the REST calls at the box, anonymously, as
CLOUDTRAIN_GCE_ENDPOINT does for Compute Engine. The SDKs load only when a method is called.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cloudtrain.core import env
from cloudtrain.providers.account import (
    AccountProbe,
    ApiState,
    CredentialSource,
    QuotaLine,
    QuotaNeed,
)

if TYPE_CHECKING:
    from cloudtrain.providers.gcp.clients import ComputeClients, GcpAuth
    from cloudtrain.providers.gcp.identity import IamClient

RUN_APIS = (
    "compute.googleapis.com",
    "iam.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "storage.googleapis.com",
)
TPU_API = "tpu.googleapis.com"  # a TPU run's too (tpu_nodes.py calls Cloud TPU API v2)
SERVICEUSAGE_ENDPOINT_ENV = env.SERVICEUSAGE_ENDPOINT.name
SERVICEUSAGE_API = "https://serviceusage.googleapis.com"
TEST_PERMISSIONS_MAX = 100
GLOBAL = "global"
# the catalog's GPU names -> their GCE quota metric (Quota.Metric of google-cloud-compute)
GPU_METRICS = {
    "T4": "NVIDIA_T4_GPUS",
    "V100": "NVIDIA_V100_GPUS",
    "P100": "NVIDIA_P100_GPUS",
    "P4": "NVIDIA_P4_GPUS",
    "K80": "NVIDIA_K80_GPUS",
    "L4": "NVIDIA_L4_GPUS",
    "A100": "NVIDIA_A100_GPUS",
    "A100-80GB": "NVIDIA_A100_80GB_GPUS",
    "H100": "NVIDIA_H100_GPUS",
}
# machine families with their own regional vCPU metric in Quota.Metric; others count as CPUS
CPU_FAMILIES = ("a2", "n2", "n2d", "c2", "c2d", "c3")


def cpu_metric(instance_type: str) -> str:
    """The regional vCPU metric `instance_type` counts against (`a2-highgpu-1g` -> A2_CPUS,
    `n1-standard-8` -> CPUS). Pure."""
    family = instance_type.split("-", 1)[0].lower()
    return f"{family.upper()}_CPUS" if family in CPU_FAMILIES else "CPUS"


def _credential_link(credentials: Any) -> str:
    """Which link of ADC's chain gave `credentials`, in google.auth.default()'s order. Reads
    the environment and the file system only."""
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS", "").strip()
    if path:
        return f"GOOGLE_APPLICATION_CREDENTIALS file {path}"
    from google.auth import _cloud_sdk  # gcloud's ADC path, as google.auth.default() finds it

    adc = _cloud_sdk.get_application_default_credentials_path()
    if os.path.isfile(adc):
        return f"gcloud application default credentials file {adc}"
    from google.auth import compute_engine

    if isinstance(credentials, compute_engine.Credentials):
        return "the metadata server (the VM's service account)"
    return f"application default credentials ({type(credentials).__name__})"


def _principal(credentials: Any) -> str:
    """The service account the credentials act as, where they say ("" for a user's, and for
    the metadata server's until its first token)."""
    email = str(getattr(credentials, "service_account_email", "") or "")
    return "" if email == "default" else email


class GcpAccountProbe(AccountProbe):
    """The caller's project (the spec's, else the environment's, else ADC's), asked
    read-only. Thread-safe; credentials and clients are built on first use."""

    def __init__(self, project: str | None = None, tpu: bool = False) -> None:
        self._project = project
        self._tpu = tpu  # a TPU run's: the TPU API and TPU_PERMISSIONS are asked too
        self._lock = threading.Lock()
        self._resolved: GcpAuth | None = None
        self._clients_built: tuple[ComputeClients, IamClient] | None = None

    def _auth(self) -> GcpAuth:
        with self._lock:
            if self._resolved is None:
                from cloudtrain.providers.gcp.clients import resolve_auth

                self._resolved = resolve_auth(self._project)
            return self._resolved

    def _built(self) -> tuple[ComputeClients, IamClient]:
        """Compute Engine's clients, and an authorized REST caller (anonymous on the box) for
        Resource Manager and Service Usage: identity.IamClient takes absolute URLs and
        translates HTTP errors."""
        auth = self._auth()
        with self._lock:
            if self._clients_built is None:
                from cloudtrain.providers.gcp.clients import ComputeClients
                from cloudtrain.providers.gcp.identity import IamClient

                self._clients_built = (ComputeClients(auth), IamClient(auth))
            return self._clients_built

    def _clients(self) -> ComputeClients:
        return self._built()[0]

    def _session(self) -> IamClient:
        return self._built()[1]

    def credentials(self) -> CredentialSource:
        """Which ADC link the SDK used, the service account where known, and the project.
        Raises CredentialsError without ADC. Blocks only while ADC is looked up."""
        from cloudtrain.providers.gcp.clients import ENDPOINT_ENV

        auth = self._auth()
        if auth.endpoint is not None:
            return CredentialSource(f"anonymous ({ENDPOINT_ENV}={auth.endpoint})", "", auth.project)
        return CredentialSource(
            _credential_link(auth.credentials), _principal(auth.credentials), auth.project
        )

    def apis(self) -> list[ApiState]:
        """Each of RUN_APIS, enabled or not, as Service Usage says; when Service Usage itself
        refuses, each API is reported not answered with its reason. Blocks."""
        from cloudtrain.core.errors import ProviderError

        project = self._auth().project
        base = (
            env.SERVICEUSAGE_ENDPOINT.text() or env.IAM_ENDPOINT.text() or SERVICEUSAGE_API
        ).rstrip("/")
        out = []
        for name in (*RUN_APIS, TPU_API) if self._tpu else RUN_APIS:
            url = f"{base}/v1/projects/{project}/services/{name}"
            try:
                state = self._session().call("GET", url, f"ask Service Usage about {name}")
            except ProviderError as err:
                out.append(ApiState(name, False, f"could not ask Service Usage: {err}"))
                continue
            if state.get("state") == "ENABLED":
                out.append(ApiState(name, True))
            else:
                detail = f"disabled in project {project}: gcloud services enable {name}"
                out.append(ApiState(name, False, detail))
        return out

    def missing_rights(self) -> list[str]:
        """RUN_PERMISSIONS (and a TPU run's TPU_PERMISSIONS) the caller does not hold in the
        project, sorted (testIamPermissions, 100 at a time). Raises ProviderError when Resource
        Manager refuses. Blocks."""
        from cloudtrain.providers.gcp.controller_identity import (
            RUN_PERMISSIONS,
            TPU_PERMISSIONS,
            _crm_base,
        )

        project = self._auth().project
        url = f"{_crm_base(project)}:testIamPermissions"
        wanted = sorted({*RUN_PERMISSIONS, *(TPU_PERMISSIONS if self._tpu else ())})
        held: set[str] = set()
        for start in range(0, len(wanted), TEST_PERMISSIONS_MAX):
            chunk = wanted[start : start + TEST_PERMISSIONS_MAX]
            answer = self._session().call(
                "POST",
                url,
                f"ask which permissions the caller holds in project {project}",
                {"permissions": chunk},
            )
            held |= set(answer.get("permissions") or [])
        return [p for p in wanted if p not in held]

    def _region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        from cloudtrain.providers.gcp.errors import gcp_errors

        clients = self._clients()
        with gcp_errors(f"read the quotas of region {region}"):
            answer = clients.regions.get(project=clients.auth.project, region=region)
        return {q.metric: (float(q.limit), float(q.usage)) for q in answer.quotas}

    def _project_quotas(self) -> dict[str, tuple[float, float]]:
        from cloudtrain.providers.gcp.errors import gcp_errors

        clients = self._clients()
        project = clients.auth.project
        with gcp_errors(f"read the quotas of project {project}"):
            answer = clients._get("ProjectsClient").get(project=project)
        return {q.metric: (float(q.limit), float(q.usage)) for q in answer.quotas}

    def quotas(self, region: str, needs: Sequence[QuotaNeed]) -> list[QuotaLine]:
        """The region's GPU and vCPU quotas `needs` count against, and the project's
        GPUS_ALL_REGIONS (see the module docstring), each with the needs that share it summed.
        Blocks (two Compute Engine reads)."""
        if not needs:
            return []
        regional = self._region_quotas(region)
        wants_gpus = any(n.accelerator in GPU_METRICS and n.accelerator_count for n in needs)
        project = self._project_quotas() if wants_gpus else {}

        def pick(regular: str, spot: bool) -> str:
            twin = f"PREEMPTIBLE_{regular}"
            return twin if spot and regional.get(twin, (0.0, 0.0))[0] > 0 else regular

        summed: dict[tuple[str, str, str], float] = {}
        for need in needs:
            cpu = cpu_metric(need.instance_type)
            cpu = pick(cpu, need.spot) if cpu == "CPUS" else cpu
            key = (region, cpu, "vCPU")
            summed[key] = summed.get(key, 0.0) + need.nodes * need.vcpus
            gpus = need.nodes * need.accelerator_count
            metric = GPU_METRICS.get(str(need.accelerator))
            if metric is None or not gpus:
                continue
            key = (region, pick(metric, need.spot), "GPU")
            summed[key] = summed.get(key, 0.0) + gpus
            if "GPUS_ALL_REGIONS" in project:
                key = (GLOBAL, "GPUS_ALL_REGIONS", "GPU")
                summed[key] = summed.get(key, 0.0) + gpus
        lines = []
        for (scope, metric, unit), need_total in summed.items():
            limit, usage = (project if scope == GLOBAL else regional).get(metric, (0.0, 0.0))
            lines.append(QuotaLine(scope, metric, unit, limit, usage, need_total))
        return sorted(lines, key=lambda q: (q.region == GLOBAL, q.unit != "GPU", q.quota))
