"""Who may reach a run's nodes, shared by every cloud's firewall code: the TensorFlow port range
and the one caller CIDR that SSH may come from. Pure apart from reading the environment.
"""

from __future__ import annotations

import ipaddress
import os

from cloudtrain.errors import ProviderError

SSH_CIDR_ENV = "CLOUDTRAIN_SSH_CIDR"


def ssh_cidr() -> str:
    """The caller's CIDR for SSH, from $CLOUDTRAIN_SSH_CIDR, normalised.

    Raises ProviderError when it is unset, invalid, or open to the whole internet."""
    raw = os.environ.get(SSH_CIDR_ENV, "").strip()
    if not raw:
        raise ProviderError(
            "ssh: true needs the address SSH may come from",
            hint=f"set {SSH_CIDR_ENV} to your public IP as a CIDR, e.g. 203.0.113.7/32",
        )
    try:
        net = ipaddress.ip_network(raw, strict=False)
    except ValueError:
        raise ProviderError(
            f"{SSH_CIDR_ENV}={raw!r} is not a CIDR", hint="e.g. 203.0.113.7/32"
        ) from None
    if net.prefixlen == 0:
        raise ProviderError(
            f"{SSH_CIDR_ENV}={raw!r} would open SSH to the whole internet",
            hint="use your own address, e.g. 203.0.113.7/32",
        )
    return str(net)


def check_port_range(low: int, high: int, run_id: str) -> None:
    """Raise ProviderError unless low-high is a valid TCP port range."""
    if not (0 < low <= high < 65536):
        raise ProviderError(f"invalid port range {low}-{high} for run {run_id}")
