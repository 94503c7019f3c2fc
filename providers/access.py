"""Who may reach a run's nodes, shared by every cloud's firewall code: the TensorFlow port range
and the one caller CIDR that SSH may come from. Pure: the deprecated variable of `ssh_cidr`
reaches the adapters only as the option (`cloudtrain.jobspec.provider_config` reads it).
"""

from __future__ import annotations

import ipaddress

from cloudtrain.core import env
from cloudtrain.core.errors import ProviderError

# deprecated: the option providers.<cloud>.ssh_cidr (job.yaml or config.yaml) replaces it; read
# only by `cloudtrain.jobspec.provider_config` (the options' ENV_FALLBACKS), which warns once
SSH_CIDR_ENV = env.SSH_CIDR.name


def cidr_problem(raw: str) -> str | None:
    """What is wrong with `raw` as the SSH source range, or None: it must be an IPv4/IPv6
    address or network (host bits may be set) and not the whole internet (prefix 0). Pure."""
    try:
        net = ipaddress.ip_network(raw.strip(), strict=False)
    except ValueError:
        return f"{raw!r} is not a CIDR (e.g. 203.0.113.7/32)"
    if net.prefixlen == 0:
        return f"{raw!r} would open SSH to the whole internet; use your own address"
    return None


def ssh_cidr(configured: str | None = None) -> str:
    """The caller's CIDR for SSH, normalised: `configured` (the provider's `ssh_cidr` option,
    which the deprecated variable still sets through provider_config). Pure.

    Raises ProviderError when it is unset, invalid, or open to the whole internet."""
    raw = (configured or "").strip()
    where = "ssh_cidr"
    if not raw:
        raise ProviderError(
            "ssh: true needs the address SSH may come from",
            hint="set providers.<cloud>.ssh_cidr in job.yaml (or the deprecated"
            f" {SSH_CIDR_ENV}) to your public IP as a CIDR, e.g. 203.0.113.7/32",
        )
    try:
        net = ipaddress.ip_network(raw, strict=False)
    except ValueError:
        raise ProviderError(f"{where}={raw!r} is not a CIDR", hint="e.g. 203.0.113.7/32") from None
    if net.prefixlen == 0:
        raise ProviderError(
            f"{where}={raw!r} would open SSH to the whole internet",
            hint="use your own address, e.g. 203.0.113.7/32",
        )
    return str(net)


def check_port_range(low: int, high: int, run_id: str) -> None:
    """Raise ProviderError unless low-high is a valid TCP port range."""
    if not (0 < low <= high < 65536):
        raise ProviderError(f"invalid port range {low}-{high} for run {run_id}")
