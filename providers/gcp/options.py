"""The `providers.gcp` section of job.yaml and config.yaml (controller side: imports pydantic).

Name rules, with their sources:
- project id: 6-30 lowercase letters, digits or '-', starting with a letter, not ending with '-'
  (cloud.google.com/resource-manager/docs/creating-managing-projects, "Project ID");
- network: RFC 1035, `[a-z]([-a-z0-9]{0,61}[a-z0-9])?` (Compute Engine API v1 discovery document,
  Network.name: "must be 1-63 characters long and match the regular expression
  `[a-z]([-a-z0-9]*[a-z0-9])?`");
- service account email: `<id>@<domain>.gserviceaccount.com`, the id 6-30 characters of
  `[a-z]([-a-z0-9]*[a-z0-9])` as IAM's projects.serviceAccounts.create `accountId` requires, or
  the Compute Engine default account `<project number>-compute@developer.gserviceaccount.com`.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, ValidationInfo, field_validator

from cloudtrain.core import env
from cloudtrain.providers.gcp.tpu_types import RUNTIMES
from cloudtrain.providers.options_base import SSH_CIDR_ENV, ProviderOptions, SshCidr

PROJECT_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
NETWORK_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
ACCOUNT_RE = re.compile(
    r"^([a-z][-a-z0-9]{4,28}[a-z0-9]|[0-9]{1,19}-compute)@[a-z0-9][-a-z0-9.]{0,251}"
    r"\.gserviceaccount\.com$"
)
DEFAULT_ACCOUNT = "default"  # the GCE keyword for the project's Compute Engine default account


class GcpOptions(ProviderOptions):
    """Options of the gcp provider. Credentials come from Application Default Credentials,
    never from here."""

    ENV_FALLBACKS: ClassVar[dict[str, str]] = {
        "network": env.GCP_NETWORK.name,
        "service_account": env.GCP_SERVICE_ACCOUNT.name,
        "signer": env.GCP_SIGNER.name,
        "ssh_cidr": SSH_CIDR_ENV,
    }

    project: str | None = Field(
        None,
        description="Google Cloud project id (default: $GOOGLE_CLOUD_PROJECT or the gcloud"
        " project); the spec's top-level `project:` is an alias",
    )
    network: str = Field(
        "default", description="the VPC network the nodes and the run's firewall rules use"
    )
    service_account: str | None = Field(
        None,
        description="an existing service account (email, or 'default') the nodes run as;"
        " default: a per-run account that reaches the run's bucket prefix only",
    )
    signer: str | None = Field(
        None,
        description="a service account (email) that signs the nodes' download URLs when your"
        " own credentials hold no key (user ADC)",
    )
    ssh_cidr: SshCidr = None
    tpu_runtime: str | None = Field(
        None,
        description="strategy tpu: the TPU VM's TensorFlow runtime version (tpu-vm-tf-...);"
        " default: the newest TensorFlow runtime of the TPU type's generation"
        " (providers/gcp/tpu_types.py)",
    )

    @field_validator("project")
    @classmethod
    def _check_project(cls, value: str | None) -> str | None:
        if value is not None and not PROJECT_RE.match(value):
            raise ValueError(
                "must be a Google Cloud project id: 6-30 lowercase letters, digits or '-',"
                f" starting with a letter (got {value!r})"
            )
        return value

    @field_validator("tpu_runtime")
    @classmethod
    def _check_tpu_runtime(cls, value: str | None) -> str | None:
        """A runtime of the table; whether it runs on the job's TPU type is the spec's rule
        (cloudtrain/jobspec/tpu_rules.py), which knows the type."""
        if value is not None and value not in RUNTIMES:
            raise ValueError(
                f"must be a TensorFlow TPU runtime version, one of: {', '.join(RUNTIMES)}"
                f" (got {value!r})"
            )
        return value

    @field_validator("network")
    @classmethod
    def _check_network(cls, value: str) -> str:
        if not NETWORK_RE.match(value):
            raise ValueError(
                "must be a VPC network name: 1-63 lowercase letters, digits or '-', starting"
                f" with a letter and not ending with '-' (got {value!r})"
            )
        return value

    @field_validator("service_account", "signer")
    @classmethod
    def _check_account(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if value == DEFAULT_ACCOUNT and info.field_name == "service_account":
            return value
        if not ACCOUNT_RE.match(value):
            raise ValueError(
                "must be a service account email, <name>@<project>.iam.gserviceaccount.com"
                f" (got {value!r})"
            )
        return value
