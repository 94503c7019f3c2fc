"""Machines in the box: every node its own host, in a network namespace on a private bridge.

    with Network() as net:
        a, b = net.add_host("chief"), net.add_host("worker-1")
        a.run(["ping", "-c1", b.ip])           # 10.213.N.2 -> 10.213.N.3 over the bridge
        b.apply_nft(ruleset)                   # b's own nftables, as its cloud's firewall
        proc = a.popen(["python3", "-m", "http.server", "--bind", a.ip, "8000"])

A `Network` is one bridge `ctb<hex>` holding `host_ip` (.1) of a /24 of 10.213.0.0/16 that no
link of this machine uses yet (chosen under a file lock, so parallel tests never collide), and
each `add_host(name)` is a namespace `ctb<hex>-<name>` with a veth pair (the host end on the
bridge, the other end renamed eth0 inside), the address .2, .3, ... /24, lo up and a default
route via `host_ip`. Emulators listening on `host_ip` are reachable from every host; the hosts
reach each other directly over the bridge.

`close()` kills every process in each namespace, then deletes the namespaces (which deletes their
veth pairs) and the bridge; it is idempotent, runs on `__exit__` also after a failure, and is
registered with atexit in case a test never gets there.

`leftovers()` lists what any code of this suite may have left on the machine: every `ctb*`
namespace, link, /etc/netns folder and nftables table of the machine, every mount whose mount
point contains "/ctb-" (the agreed marker for the Debian roots and their overlays,
tests/fakes/debian_root.py, and anything else mounted by the suite), and every process still
inside a `ctb*` namespace. The end of the pytest session fails if it is not empty
(tests/conftest.py).

Ownership, for helpers running test sessions side by side: a Network records its owner (this
process's pid) under OWNERS; `claim(key)` does the same for any other marker (a mount folder's
name). `leftovers(skip_live_owners=True)` skips what belongs to another process that is still
alive: its session is not over yet, so it cannot have left anything. Nothing is skipped by
default.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

PREFIX = "ctb"
MOUNT_MARKER = "/ctb-"  # a mount point containing this is the suite's (Debian roots, overlays)
SPACE = "10.213"  # the suite's addresses: 10.213.0.0/16 (issue 16)
OWNERS = Path("/run/ctb-owners")  # <key> -> pid of the process that owns what is named by key
_LOCK = Path("/run/ctb-netns.lock")
# `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/* (ip-netns(8)): a host's own
# resolv.conf names no reachable server, so a lookup fails at once instead of timing out against
# the machine's resolver, which a host cannot reach (http.server's getfqdn took 10 s)
ETC_NETNS = Path("/etc/netns")
RESOLV_CONF = "# cloudtrain test host: no DNS (tests/fakes/netns.py)\nnameserver 127.0.0.1\n"
# The link-local instance metadata address of EC2 and Azure, and GCE's name for it (GCE's images
# list metadata.google.internal in /etc/hosts; cloud.google.com/compute/docs/metadata/overview)
LINK_LOCAL = "169.254.169.254"
HOSTS = f"127.0.0.1 localhost\n::1 localhost\n{LINK_LOCAL} metadata.google.internal metadata\n"
_NAME = re.compile(r"[^a-z0-9-]+")


def unavailable() -> str | None:
    """Why this machine cannot make namespaces (not root, no iproute2 or nftables), else None:
    a test module skips with this reason."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def require() -> None:
    """Fail the calling test when this machine cannot make namespaces (see `unavailable`):
    never a skip, as with every tool the suite uses (tests/fakes/shell.require_tool):
    tests/run.sh installs iproute2 and nftables, and the suite runs as root."""
    import pytest

    problem = unavailable()
    if problem is not None:
        pytest.fail(f"{problem}: tests/run.sh installs iproute2 and nftables (as root)", False)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    _LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _used_subnets() -> set[int]:
    """Third octets of 10.213.x.0/24 that an address of this machine (any link) already uses."""
    out = _ip("-j", "addr").stdout
    used: set[int] = set()
    for link in json.loads(out or "[]"):
        for addr in link.get("addr_info", []):
            parts = str(addr.get("local", "")).split(".")
            if len(parts) == 4 and ".".join(parts[:2]) == SPACE:
                used.add(int(parts[2]))
    return used


def claim(key: str) -> None:
    """Record this process as the owner of what is named by `key` (a namespace/link hex, or a
    mount folder's name). Idempotent; `release(key)` undoes it."""
    OWNERS.mkdir(parents=True, exist_ok=True)
    (OWNERS / key).write_text(str(os.getpid()))


def release(key: str) -> None:
    """Forget the owner of `key`. Idempotent."""
    with contextlib.suppress(FileNotFoundError):
        (OWNERS / key).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie has exited: it owns nothing any more
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return False


def _live_foreign_keys() -> set[str]:
    """Keys owned by a live process other than this one."""
    keys: set[str] = set()
    if not OWNERS.is_dir():
        return keys
    for entry in OWNERS.iterdir():
        with contextlib.suppress(OSError, ValueError):
            pid = int(entry.read_text().strip())
            if pid != os.getpid() and _alive(pid):
                keys.add(entry.name)
    return keys


class Host:
    """One machine: a namespace with eth0 at `ip` on its Network's bridge."""

    def __init__(self, name: str, ns: str, ip: str) -> None:
        self.name, self.ns, self.ip = name, ns, ip

    def __repr__(self) -> str:
        return f"Host({self.name!r}, ns={self.ns!r}, ip={self.ip!r})"

    def prefix(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.ns]

    def run(self, args: list[str], **kw: object) -> subprocess.CompletedProcess:
        """Run `args` on this host and wait (subprocess.run's keywords; timeout 60 s unless
        given)."""
        kw.setdefault("timeout", 60)
        return subprocess.run([*self.prefix(), *args], **kw)  # type: ignore[call-overload]

    def popen(self, args: list[str], **kw: object) -> subprocess.Popen:
        """Start `args` on this host; does not wait. close() of the Network kills it."""
        return subprocess.Popen([*self.prefix(), *args], **kw)  # type: ignore[call-overload]

    def apply_nft(self, ruleset: str) -> None:
        """Load `ruleset` (nft syntax) into this host's nftables, replacing whatever it had, in
        one transaction (`flush ruleset` first). Blocks; raises CalledProcessError with nft's
        message on a bad ruleset (the old rules then stay)."""
        subprocess.run(
            [*self.prefix(), "nft", "-f", "-"],
            input="flush ruleset\n" + ruleset,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )

    def pids(self) -> list[int]:
        """Processes running in this host's namespace now."""
        return _ns_pids(self.ns)


def _ns_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_ns_processes(ns: str, wait_s: float = 5.0) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        pids = _ns_pids(ns)
        if not pids or time.monotonic() >= deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def delete_namespace(ns: str) -> None:
    """Kill every process in namespace `ns`, then delete it (and so its veth pair). Idempotent."""
    _kill_ns_processes(ns)
    _ip("netns", "del", ns, check=False)
    for name in ("resolv.conf", "hosts"):
        with contextlib.suppress(FileNotFoundError):
            (ETC_NETNS / ns / name).unlink()
    with contextlib.suppress(OSError):
        (ETC_NETNS / ns).rmdir()


class Network:
    """A private L2 network of hosts. A context manager; `close()` is idempotent."""

    def __init__(self) -> None:
        """Create the bridge with `host_ip` on a free /24. Blocks (a few ip calls)."""
        self.hex = secrets.token_hex(3)
        self.bridge = f"{PREFIX}{self.hex}"
        self.hosts: dict[str, Host] = {}
        self._outer: dict[str, str] = {}  # host name -> its veth end on the bridge
        self._next = 2  # the next host's last octet
        self._closed = False
        claim(self.hex)
        atexit.register(self.close)
        try:
            with _locked():
                free = sorted(set(range(1, 255)) - _used_subnets())
                if not free:
                    raise RuntimeError(f"no free /24 left in {SPACE}.0.0/16")
                octet = free[secrets.randbelow(len(free))]
                self.subnet = f"{SPACE}.{octet}.0/24"
                self.host_ip = f"{SPACE}.{octet}.1"
                _ip("link", "add", self.bridge, "type", "bridge")
                _ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
                _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_host(self, name: str) -> Host:
        """A new host `name` (letters, digits, '-'; others become '-'): its own namespace on
        the bridge with the next address. Blocks; returns the Host (the same one for a name
        added before)."""
        if self._closed:
            raise RuntimeError("this Network is closed")
        clean = _NAME.sub("-", name.lower()).strip("-") or "host"
        if clean in self.hosts:
            return self.hosts[clean]
        index = self._next
        self._next += 1
        if index > 254:
            raise RuntimeError(f"{self.subnet} is full")
        ns = f"{self.bridge}-{clean}"
        ip = self.host_ip.rsplit(".", 1)[0] + f".{index}"
        outer, inner = f"{self.bridge}h{index}", f"{self.bridge}n{index}"
        host = Host(clean, ns, ip)
        # registered first: close() removes a half-made host too
        self.hosts[clean], self._outer[clean] = host, outer
        (ETC_NETNS / ns).mkdir(parents=True, exist_ok=True)
        (ETC_NETNS / ns / "resolv.conf").write_text(RESOLV_CONF)
        (ETC_NETNS / ns / "hosts").write_text(HOSTS)
        _ip("netns", "add", ns)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", outer, "master", self.bridge)
        _ip("link", "set", outer, "up")
        _ip("-n", ns, "link", "set", inner, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "route", "add", "default", "via", self.host_ip)
        return host

    def remove_host(self, name: str) -> None:
        """Kill the host's processes and delete its namespace and veth pair. Idempotent."""
        clean = _NAME.sub("-", name.lower()).strip("-")
        host = self.hosts.pop(clean, None)
        if host is not None:
            delete_namespace(host.ns)
            _ip("link", "del", self._outer.pop(clean), check=False)

    def serve_link_local(self, port: int) -> None:
        """Send every host's TCP to 169.254.169.254:80 (the clouds' instance metadata service)
        to `host_ip:port`, where a fake metadata service listens (tests/fakes/metadata_server):
        a DNAT rule in the machine's nftables table `ctb<hex>`, which close() deletes. The
        service sees the asking host's own address as the source. Idempotent; blocks."""
        table = f"""table ip {self.bridge}
delete table ip {self.bridge}
table ip {self.bridge} {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    ip saddr {self.subnet} ip daddr {LINK_LOCAL} tcp dport 80 dnat to {self.host_ip}:{port}
  }}
}}
"""
        subprocess.run(
            ["nft", "-f", "-"], input=table, text=True, capture_output=True, check=True, timeout=30
        )

    def close(self) -> None:
        """Kill the processes in every host, delete the namespaces, veths and the bridge.
        Idempotent; never raises for what is already gone."""
        if self._closed:
            return
        self._closed = True
        for host in self.hosts.values():
            delete_namespace(host.ns)
        subprocess.run(
            ["nft", "delete", "table", "ip", self.bridge],
            capture_output=True,
            timeout=30,
            check=False,
        )
        for name in _links():  # a veth whose namespace end never moved, and the bridge
            if name.startswith(self.bridge):
                _ip("link", "del", name, check=False)
        release(self.hex)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


def _links() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _mounts() -> list[str]:
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2:
                points.append(fields[1].encode().decode("unicode_escape"))
    return points


def _nft_tables() -> list[str]:
    """The machine's nftables tables named ctb* ("<family> <name>")."""
    try:
        out = subprocess.run(
            ["nft", "list", "tables"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    tables = [line.split(None, 1)[1] for line in out.splitlines() if line.startswith("table ")]
    return [t for t in tables if t.split()[-1].startswith(PREFIX)]


def leftovers(skip_live_owners: bool = False) -> list[str]:
    """Everything of the suite still on this machine, one line each: `ctb*` namespaces and
    links, mounts containing "/ctb-", processes inside `ctb*` namespaces. Empty when clean.
    With `skip_live_owners`, what another live process owns (see `claim`) is left out."""
    skip = _live_foreign_keys() if skip_live_owners else set()

    def skipped(name: str) -> bool:
        return any(key in name for key in skip)

    found: list[str] = []
    for ns in _namespaces():
        if ns.startswith(PREFIX) and not skipped(ns):
            found.append(f"namespace {ns}")
            found += [f"process {pid} in namespace {ns}" for pid in _ns_pids(ns)]
    if ETC_NETNS.is_dir():
        found += [
            f"folder {entry}"
            for entry in sorted(ETC_NETNS.iterdir())
            if entry.name.startswith(PREFIX) and not skipped(entry.name)
        ]
    found += [f"link {name}" for name in _links() if name.startswith(PREFIX) and not skipped(name)]
    found += [f"nftables table {t}" for t in _nft_tables() if not skipped(t)]
    found += [
        f"mount {point}" for point in _mounts() if MOUNT_MARKER in point and not skipped(point)
    ]
    return found
