"""The `providers.slurm` section of job.yaml and config.yaml (controller side: imports pydantic):
how to reach the cluster's login host, where the run's files go on its shared filesystem, and
what to ask Slurm for.

Name rules, with their sources:
- host: a DNS name (RFC 1123 labels) or an IPv4 address; user: a POSIX portable user name
  (`[A-Za-z0-9._][A-Za-z0-9._-]*`, POSIX.1-2017 3.437); an `options` entry is one ssh_config(5)
  `Name=value` (the keyword letters only, the value without newlines);
- partition, account, QOS: Slurm's names hold no space, `,` or `|` (slurm.conf(5)
  PartitionName; sacctmgr(1)); cloudtrain takes letters, digits, `_`, `.` and `-`;
- workdir: a folder on the cluster's shared filesystem, absolute or under the user's home (no
  `..`, no control character): every node must see it at the same path.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from cloudtrain.providers.options_base import ProviderOptions

_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_RE = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
USER_RE = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,31}$")
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SSH_OPTION_RE = re.compile(r"^[A-Za-z]{1,40}=[^\x00-\x1f\x7f]{1,500}$")
WORKDIR_RE = re.compile(r"^(/|~/)?[A-Za-z0-9_.@+/-]{1,400}$")
DEFAULT_WORKDIR = "cloudtrain"  # under the user's home: shared by the nodes on most clusters


class SlurmOptions(ProviderOptions):
    """Options of the slurm provider. The SSH key is a file on this machine; cloudtrain never
    reads or copies it (ssh does)."""

    host: str | None = Field(None, description="the cluster's login host (DNS name or address)")
    user: str | None = Field(None, description="your user name on the cluster")
    key: str | None = Field(
        None, description="your SSH private key file (default: ssh's own keys and agent)"
    )
    port: int = Field(22, ge=1, le=65535, description="the login host's SSH port")
    known_hosts: str | None = Field(
        None,
        description="the known_hosts file holding the login host's key (default:"
        " ~/.ssh/known_hosts); cloudtrain never accepts a host key it has not been given",
    )
    options: list[str] = Field(
        default_factory=list,
        description="extra ssh options, each Name=value (e.g. ProxyJump=bastion.example.org)",
    )
    partition: str | None = Field(None, description="the partition (default: the cluster's)")
    account: str | None = Field(None, description="the Slurm account to charge (--account)")
    qos: str | None = Field(None, description="the quality of service (--qos)")
    workdir: str = Field(
        DEFAULT_WORKDIR,
        description="the run's folder on the shared filesystem, absolute or under your home;"
        " every node must see it at the same path",
    )
    python: str = Field(
        "python3",
        description="the cluster's Python (3.10+) over which the node stack's venv is made on"
        " the login host, once per pin set; with the pinned TensorFlow it is used as it is",
    )
    gpu_hour_usd: float | None = Field(
        None, ge=0, description="what one GPU-hour costs on this cluster (for cost and budget)"
    )

    @field_validator("host")
    @classmethod
    def _check_host(cls, value: str | None) -> str | None:
        if value is not None and not HOST_RE.fullmatch(value):
            raise ValueError(f"must be a host name or an IPv4 address (got {value!r})")
        return value

    @field_validator("user")
    @classmethod
    def _check_user(cls, value: str | None) -> str | None:
        if value is not None and not USER_RE.fullmatch(value):
            raise ValueError(f"must be a user name: letters, digits, '.', '_', '-' (got {value!r})")
        return value

    @field_validator("partition", "account", "qos")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None and not NAME_RE.fullmatch(value):
            raise ValueError(
                f"must be a Slurm name: letters, digits, '_', '.', '-' (got {value!r})"
            )
        return value

    @field_validator("options")
    @classmethod
    def _check_options(cls, value: list[str]) -> list[str]:
        for option in value:
            if not SSH_OPTION_RE.fullmatch(option):
                raise ValueError(f"each must be one ssh option Name=value (got {option!r})")
        return value

    @field_validator("workdir")
    @classmethod
    def _check_workdir(cls, value: str) -> str:
        bare = value.removeprefix("~/").strip("/")
        if not WORKDIR_RE.fullmatch(value) or not bare or ".." in value.split("/"):
            raise ValueError(
                "must be a folder, absolute or under your home, of letters, digits and"
                f" '_.@+/-', without '..' (got {value!r})"
            )
        return value.rstrip("/") or "/"
