"""Horovod without horovodrun, mpirun or SSH: the node agents launch the ranks themselves.

Under ``strategy: horovod`` every node is a ``worker``; worker 0 is the rendezvous host (the
chief). After the bucket rendezvous each agent knows every node's address and GPU count (its
``attempt-<n>/nodes/worker-<i>.json`` registration carries ``slots``), so each one computes the
same slot plan that ``horovodrun`` would (``horovod.runner.common.util.hosts.
get_host_assignments``) and starts ONE PROCESS PER GPU (one process on a node without GPUs)
with Horovod's Gloo environment:

- ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``_PORT``: worker 0's registered address. Horovod runs no
  TensorFlow server, so worker 0's port (one of the run's ports, open between its nodes) is
  free for the HTTP rendezvous server that its agent starts before its ranks;
- ``HOROVOD_CONTROLLER=gloo``, ``HOROVOD_CPU_OPERATIONS=gloo``;
- ``HOROVOD_RANK``/``_SIZE``, ``HOROVOD_LOCAL_RANK``/``_SIZE``, ``HOROVOD_CROSS_RANK``/``_SIZE``
  and ``HOROVOD_HOSTNAME`` (the node's name, ``worker-<i>``: Gloo only uses it to name the
  node's local scope, and it stays unique where nodes share an IP, as on ``local``);
- ``CUDA_VISIBLE_DEVICES`` = the local rank on a node with GPUs; never ``TF_CONFIG``;
- ``HOROVOD_GLOO_IFACE``: the interface that holds the node's registered address, unless the
  job's environment names one. Without it Gloo binds the address its host name resolves to
  (gloo/transport/tcp/device.cc: gethostname, then getaddrinfo), which is 127.0.0.1 wherever
  /etc/hosts says so (this machine; Debian's and Ubuntu's 127.0.1.1 line): every rank would
  publish a loopback address and no rank of another node could connect. ``horovodrun`` sets it
  too (horovod/runner/gloo_run.py: the common NIC).
- ``HOROVOD_GLOO_TIMEOUT_SECONDS``: ``GLOO_TIMEOUT_S`` (Horovod's 30 s is shorter than a slow
  node's TensorFlow import), unless the job's environment names one.

The functions computing plans and environments are pure. Horovod itself is imported lazily,
only by ``start_rendezvous_server`` on worker 0: it does not build against the nodes' pinned
TensorFlow (2.21), so a horovod job's nodes run a stack of their own (tensorflow 2.15.1,
horovod 0.28.1 built with Gloo: cloudtrain/run/startup.py, HOROVOD_STACK), which the bootstrap
installs where the image lacks it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cloudtrain.core.env import IS_CHIEF
from cloudtrain.jobs.strategies import HOROVOD

# the strategy this launcher serves (jobs/strategies.py declares it: launch "horovod_ranks");
# jobs/rendezvous.py still compares a run's strategy with it
STRATEGY = HOROVOD.name
ROLE = "worker"  # every node of a horovod job; worker 0 hosts the rendezvous
GLOO_IFACE = "HOROVOD_GLOO_IFACE"  # the interface Gloo binds (the module docstring)
# How long a rank waits for every other rank at Gloo's rendezvous (gloo_context.cc reads it;
# Horovod's default, and horovodrun's --gloo-timeout-seconds, is 30 s). The ranks of the nodes
# start at once but import TensorFlow at their own speed: a fresh VM reading its stack from a
# cold disk, or a replacement node, can be minutes behind (CI saw 30 s pass while the
# replacement's ranks loaded). Determined AI raises it to 240 s for the same reason
# (constants.HOROVOD_GLOO_TIMEOUT_SECONDS); a job's own value is kept.
GLOO_TIMEOUT = "HOROVOD_GLOO_TIMEOUT_SECONDS"
GLOO_TIMEOUT_S = 300


class HorovodError(RuntimeError):
    """A horovod launch cannot go ahead (a bad slot plan, an unreadable GPU count...)."""


class HorovodUnavailable(HorovodError):
    """``horovod`` is not importable on the rendezvous host (worker 0)."""


@dataclass(frozen=True)
class Slot:
    """One process of the job, with the fields of Horovod's ``SlotInfo``."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


class Stoppable(Protocol):
    """A running rendezvous server."""

    def stop(self) -> None:
        """Stop serving and release the port. Idempotent."""


ServerStarter = Callable[[int, Sequence[Slot]], Stoppable]


# --- pure functions: GPU count, slot plan, environments ---------------------------------------
def gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """The node's GPU count from ``CT_GPU_COUNT`` (set by the bootstrap; unset or empty = 0).
    Raises HorovodError for a value that is not a whole number >= 0."""
    raw = (os.environ if environ is None else environ).get("CT_GPU_COUNT", "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise HorovodError(f"CT_GPU_COUNT must be a whole number of GPUs (got {raw!r})")
    return int(raw)


def local_slots(environ: Mapping[str, str] | None = None) -> int:
    """How many Horovod processes this node runs: one per GPU, and 1 on a node without GPUs."""
    return max(1, gpu_count(environ))


def slot_plan(hosts: Sequence[tuple[str, int]]) -> list[Slot]:
    """Every process of the job, in rank order, for ``hosts`` = ``[(hostname, slots), ...]``
    in node order: global rank = the slots of earlier nodes + local rank, cross rank = node
    index, cross size = node count (what ``get_host_assignments`` gives when all nodes have the
    same slots). Raises HorovodError for no hosts, a duplicate name, slots < 1, or nodes with
    different slot counts (cross rank/size would not be the node index/count)."""
    if not hosts:
        raise HorovodError("horovod needs at least one node")
    names = [name for name, _ in hosts]
    if len(set(names)) != len(names) or not all(names):
        raise HorovodError(f"horovod host names must be unique and non-empty (got {names})")
    for name, slots in hosts:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise HorovodError(f"{name} must run at least 1 process (got {slots!r} slots)")
    if len({slots for _, slots in hosts}) > 1:
        shown = ", ".join(f"{name} has {slots}" for name, slots in hosts)
        raise HorovodError(
            f"horovod needs the same number of GPUs on every node ({shown}): give all nodes"
            " the same accelerator"
        )
    local_size, cross_size = hosts[0][1], len(hosts)
    size = local_size * cross_size
    return [
        Slot(name, node * local_size + local, local, node, size, local_size, cross_size)
        for node, (name, _) in enumerate(hosts)
        for local in range(local_size)
    ]


def process_envs(
    hosts: Sequence[tuple[str, int]],
    node_index: int,
    rendezvous: tuple[str, int],
    *,
    pin_gpus: bool = True,
) -> list[dict[str, str]]:
    """The Horovod environment of each process of node ``node_index``, in local-rank order.

    ``hosts`` is ``[(hostname, slots), ...]`` in node order (see ``slot_plan``), ``rendezvous``
    the ``(host, port)`` of the rendezvous server. Each dict holds the ``HOROVOD_*`` variables
    listed in the module docstring and, with ``pin_gpus``, ``CUDA_VISIBLE_DEVICES`` = the local
    rank. Raises HorovodError for a bad plan, node index or rendezvous address."""
    plan = slot_plan(hosts)
    if isinstance(node_index, bool) or not 0 <= node_index < len(hosts):
        raise HorovodError(f"node index {node_index} out of range for {len(hosts)} nodes")
    host, port = rendezvous
    if not host or not 0 < int(port) < 65536:
        raise HorovodError(f"bad horovod rendezvous address {host!r}:{port!r}")
    envs: list[dict[str, str]] = []
    for slot in plan:
        if slot.cross_rank != node_index:
            continue
        env = {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": host,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(int(port)),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_HOSTNAME": slot.hostname,
            "HOROVOD_RANK": str(slot.rank),
            "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        }
        if pin_gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(slot.local_rank)
        envs.append(env)
    return envs


_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's IPv4 address


def interface_of(ip: str) -> str | None:
    """The name of the network interface holding the IPv4 address ``ip`` in this network
    namespace, or None (no such interface, not an IPv4 address, not Linux). Asks the kernel
    (SIOCGIFADDR per interface); blocks for microseconds."""
    try:
        wanted = socket.inet_aton(ip)
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it
                continue
            if answer[20:24] == wanted:
                return name
    return None


def node_hosts(registrations: Sequence[Mapping[str, Any] | None]) -> list[tuple[str, int]]:
    """``[("worker-<i>", slots), ...]`` from the workers' registrations of the attempt, in index
    order. Raises HorovodError when one is missing or carries no valid ``slots``."""
    hosts: list[tuple[str, int]] = []
    for index, reg in enumerate(registrations):
        slots = (reg or {}).get("slots")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise HorovodError(
                f"{ROLE}-{index} registered no horovod slot count (got {slots!r}): every node"
                " must run the same cloudtrain agent"
            )
        hosts.append((f"{ROLE}-{index}", slots))
    return hosts


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``. Raises HorovodError when it is not of that form."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise HorovodError(f"the rendezvous host's address {address!r} is not 'host:port'")
    return host, int(port)


# --- the rendezvous server (worker 0 only; imports horovod) ------------------------------------
class _HttpRendezvous:
    """Horovod's HTTP rendezvous server on a fixed port (``RendezvousServer.start`` only picks a
    random one, which the run's firewall would not let through)."""

    def __init__(self, httpd: Any) -> None:
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, daemon=True, name="horovod-rendezvous"
        )
        self._thread.start()
        self._stopped = False

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def start_rendezvous_server(port: int, plan: Sequence[Slot], verbose: int = 0) -> Stoppable:
    """Start Horovod's Gloo rendezvous server (``horovod.runner.http.http_server``) on all
    interfaces at ``port``, initialised with ``plan`` (what ``horovodrun`` does in its launcher).
    Returns it running; the caller must ``stop()`` it. Raises HorovodUnavailable when horovod is
    not importable, HorovodError when the port cannot be bound."""
    try:
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    except Exception as exc:  # ImportError, or a broken install failing as it loads
        raise HorovodUnavailable(
            f"strategy {STRATEGY!r} needs the horovod package on worker-0 (the rendezvous host),"
            f" but it cannot be imported ({type(exc).__name__}: {exc}); the bootstrap installs"
            " it (tensorflow 2.15.1, horovod 0.28.1) on images with Python 3.9-3.11, else use an"
            " image whose python3 ships Horovod"
        ) from exc
    try:
        httpd = RendezvousHTTPServer(("", port), RendezvousHandler, verbose)
    except OSError as exc:
        raise HorovodError(
            f"cannot start the horovod rendezvous server on port {port}: {exc}"
        ) from exc
    httpd.init([SlotInfo(**vars(slot)) for slot in plan])
    return _HttpRendezvous(httpd)


# --- the node's processes ----------------------------------------------------------------------
class ProcessGroup:
    """The node's Horovod processes, seen by the agent like one ``Popen``.

    All processes share one process group whose id is ``pid`` (the first process's), so
    ``os.killpg(group.pid, sig)`` reaches every rank and whatever they started. ``poll()``
    returns the node's outcome as soon as it is decided: the exit code of the first failed
    rank (lowest rank among those that failed) once any rank fails, 0 once all exited 0, else
    None. ``wait()`` blocks until EVERY process has exited (the other ranks may still be
    writing a checkpoint), then stops the rendezvous server if this node runs it.
    """

    def __init__(
        self,
        procs: Sequence[subprocess.Popen[bytes]],
        ranks: Sequence[int],
        server: Stoppable | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        if not procs or len(procs) != len(ranks):
            raise ValueError("a process group needs one rank per process")
        self.procs, self.ranks, self.server = list(procs), list(ranks), server
        self.pid = self.procs[0].pid
        self.returncode: int | None = None
        self.failed_rank: int | None = None
        self._say = say or (lambda _message: None)

    def poll(self) -> int | None:
        """The node's exit code once decided (see the class docstring), else None."""
        if self.returncode is not None:
            return self.returncode
        codes = [proc.poll() for proc in self.procs]
        for rank, code in zip(self.ranks, codes, strict=True):
            if code is not None and code != 0:
                self.returncode, self.failed_rank = code, rank
                running = sum(c is None for c in codes)
                self._say(f"horovod rank {rank} exited with code {code} ({running} still running)")
                return code
        if all(code == 0 for code in codes):
            self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait until every process has exited; return the node's exit code. Raises
        ``subprocess.TimeoutExpired`` after ``timeout`` seconds (the processes keep running)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for proc in self.procs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            proc.wait(timeout=left)
        server, self.server = self.server, None
        if server is not None:
            server.stop()
        code = self.poll()
        assert code is not None  # every process has exited
        return code


StartFn = Callable[..., subprocess.Popen[bytes]]


def launch_node(
    command: str,
    base_env: Mapping[str, str],
    addresses: Sequence[str],
    registrations: Sequence[Mapping[str, Any] | None],
    node_index: int,
    *,
    start: StartFn,
    start_server: ServerStarter = start_rendezvous_server,
    say: Callable[[str], None] = lambda _message: None,
) -> ProcessGroup:
    """Start this node's ranks of ``command`` and return them as a ProcessGroup.

    ``addresses``/``registrations`` are the workers' registered addresses and registration
    documents of the attempt, in index order; worker 0's address is the rendezvous server,
    which ``start_server(port, plan)`` starts here first when ``node_index`` is 0. Each rank is
    ``start(command, env, prefix="[rank R] ", process_group=P)`` (the agent's ``start``: P is 0
    for the first rank, then its pid) with ``base_env`` plus its Horovod environment and
    ``CLOUDTRAIN_IS_CHIEF`` = 1 on rank 0 only. ``TF_CONFIG`` is removed. On any failure the
    ranks already started are killed, the server is stopped, and the error is raised
    (HorovodError for a bad plan or a missing horovod)."""
    if not addresses or len(addresses) != len(registrations):
        raise HorovodError("horovod needs every worker's address and registration")
    hosts = node_hosts(registrations)
    rendezvous = split_address(addresses[0])
    envs = process_envs(hosts, node_index, rendezvous, pin_gpus=gpu_count(base_env) > 0)
    size = len(hosts) * hosts[0][1]
    server = None
    if node_index == 0:
        server = start_server(rendezvous[1], slot_plan(hosts))
        say(f"horovod: rendezvous server on port {rendezvous[1]} for {size} processes")
    ranks = [int(env["HOROVOD_RANK"]) for env in envs]
    iface = base_env.get(GLOO_IFACE) or interface_of(split_address(addresses[node_index])[0])
    if iface:
        for env in envs:
            env[GLOO_IFACE] = iface
    timeout = base_env.get(GLOO_TIMEOUT) or str(GLOO_TIMEOUT_S)
    for env in envs:
        env[GLOO_TIMEOUT] = timeout
    say(
        f"horovod: starting {len(envs)} process(es), ranks {ranks[0]}-{ranks[-1]} of {size},"
        f" rendezvous {rendezvous[0]}:{rendezvous[1]}"
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank, hvd_env in zip(ranks, envs, strict=True):
            env = {k: v for k, v in base_env.items() if k != "TF_CONFIG"}
            env.update(hvd_env, **{IS_CHIEF.name: "1" if rank == 0 else "0"})
            group = procs[0].pid if procs else 0
            procs.append(start(command, env, prefix=f"[rank {rank}] ", process_group=group))
    except BaseException:
        if procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(procs[0].pid, signal.SIGKILL)
        for proc in procs:
            proc.wait()
        if server is not None:
            server.stop()
        raise
    return ProcessGroup(procs, ranks, server, say)
