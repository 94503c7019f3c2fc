"""The knobs of one run (`RunOptions`): how closely it is watched, how long each wait lasts.

Defaults suit the clouds; a provider whose nodes boot in seconds is watched more closely. The
environment's one knob, $CLOUDTRAIN_HEARTBEAT_TIMEOUT_S, is read by `env_overrides`. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cloudtrain.core import env


@dataclass(frozen=True)
class RunOptions:
    """Knobs of one run. Defaults suit the clouds; `for_provider(name)` applies the provider's
    own (`ProviderInfo.run_defaults`: local's are tighter)."""

    detach: bool = False
    # with detach on a cloud: a controller node watches the run (False: `--no-controller`)
    controller: bool = True
    poll_s: float = 2.0
    list_nodes_s: float = 15.0
    heartbeat_timeout_s: float = 180.0
    boot_timeout_s: float = 1200.0
    rendezvous_timeout_s: float = 600.0
    stop_grace_s: float = 30.0
    failure_grace_s: float = 5.0
    settle_s: float = 10.0
    linger_s: float = 600.0  # agents end this long after the job's end if nobody tears down
    # the budget stop comes `stop_grace_s` plus this many seconds of the cluster's $/h early,
    # so the graceful stop and the teardown are paid for within max_cost_usd
    teardown_margin_s: float = 300.0

    @classmethod
    def for_provider(cls, name: str, **overrides: Any) -> RunOptions:
        """Defaults for a provider (the knobs its INFO declares, `run_defaults`: local nodes
        boot in seconds, so it is watched more closely), then the environment's knobs
        (`env_overrides`), then `overrides`. Raises UsageError for a bad knob in the
        environment."""
        from cloudtrain.providers.registry import declared

        base: dict[str, Any] = dict(declared(name).run_defaults)
        base.update(env_overrides())
        base.update(overrides)
        if base.get("detach") and not base.get("controller", True) and "linger_s" not in overrides:
            base["linger_s"] = 120.0  # nobody will tear down: end soon after the job
        return cls(**base)


HEARTBEAT_TIMEOUT_ENV = env.HEARTBEAT_TIMEOUT.name
# at least five of the agent's beats (jobs/protocol.py: ClusterConfig.heartbeat_s = 2 s), so a
# node that is only slow to write is never taken for lost
MIN_HEARTBEAT_TIMEOUT_S = 10.0


def env_overrides() -> dict[str, Any]:
    """The run knobs set in the environment: $CLOUDTRAIN_HEARTBEAT_TIMEOUT_S, the seconds a
    node the cloud still lists may go without a heartbeat before it counts as lost (a VM cut
    off from the network; default 180, local 60). Reads the environment only. Raises UsageError
    when it is set but not a number of seconds >= MIN_HEARTBEAT_TIMEOUT_S."""
    value = env.HEARTBEAT_TIMEOUT.text()
    if not value:
        return {}
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not MIN_HEARTBEAT_TIMEOUT_S <= seconds < float("inf"):
        from cloudtrain.core.errors import UsageError

        raise UsageError(
            f"{HEARTBEAT_TIMEOUT_ENV}={value!r} is not a heartbeat timeout",
            hint=f"set it to a number of seconds >= {MIN_HEARTBEAT_TIMEOUT_S:g}, or unset it",
        )
    return {"heartbeat_timeout_s": seconds}
