"""A real Slurm cluster in the box (issue 33): Debian's Slurm 22.05 and MUNGE, every machine its
own host in a network namespace (tests/fakes/netns.py), reached the way users reach a cluster:
over SSH to its login host.

    with SlurmBox(tmp_path / "slurm") as cluster:
        out = cluster.ssh("sinfo", "-h", "-o", "%N %T %G")     # through the login host's sshd
        cluster.set_state("c2", "DOWN")                       # as an administrator would

The hosts: `login` (sshd; the client commands sbatch, squeue, sacct, scancel, scontrol, sinfo,
srun), `ctl` (slurmctld) and `c1`..`cN` (slurmd each), every one with its own munged (the
cluster's one key) and address. What is real: the daemons, their RPCs over the bridge, MUNGE's
credentials, the scheduler, partitions, GRES scheduling and the steps srun starts on each
compute host. What is not a cluster's: the daemons run as root (SlurmUser=root, as the box's
SSH user is root), there is no slurmdbd (accounting for `sacct` comes from the job completion
log, jobcomp/filetxt: `sacct -c`), and processes are tracked by proctrack/linuxproc, not
cgroups (a namespace host has no cgroup tree of its own).

Traps of running several Slurm hosts on one machine, and what the box does about each:
- slurmctld and slurmd check that the host's name is the one slurm.conf gives them ("This host
  (vm/vm) not a valid controller"): each daemon runs under `unshare --uts` with its host's name.
- every host needs its own munged, whose socket is a path on the one shared filesystem: each
  host's slurm.conf names its own (AuthInfo=socket=...); they differ only there, so the
  controller's check that all hosts share one config is off (DebugFlags=NO_CONF_HASH).
- slurmd's pid file, spool and log take the node name (%n).
- GPUs: gres.conf's File= must name character devices, from whose numbers Slurm derives
  CUDA_VISIBLE_DEVICES: the box makes them with the NVIDIA driver's major number 195
  (/dev/nvidia<i>) under its own folder; no GPU exists behind them.
- MpiDefault=none: Debian's default plugin list tries PMIx, which it does not ship.

Sources: slurm.conf(5), gres.conf(5), sacct(1) `-c`, munged(8) `--socket`, sshd_config(5)
`SetEnv` (Slurm 22.05.8 and OpenSSH 9.2 as Debian 12 ships them).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tests.fakes import netns
from tests.fakes.netns import Host, Network

CLIENT_COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "srun")
DAEMONS = ("slurmctld", "slurmd", "munged", "sshd")
NVIDIA_MAJOR = 195  # the NVIDIA driver's character devices, /dev/nvidia<i>
START_TIMEOUT_S = 60.0


def missing() -> list[str]:
    """The commands of the box this machine lacks (tests/run.sh installs their packages)."""
    return [c for c in (*DAEMONS, *CLIENT_COMMANDS, "ssh", "ssh-keygen") if not shutil.which(c)]


T = TypeVar("T")


class SlurmError(RuntimeError):
    """The box could not start, or a command through it failed."""


def wait_for(
    what: str, read: Callable[[], T], done: Callable[[T], bool] = bool, timeout: float = 60
) -> T:
    """`read()` again and again (every 0.3 s) until `done` holds for its value; that value.
    AssertionError naming `what` and the last value after `timeout` seconds. Blocks."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"not in {timeout:.0f} s: {what}: {value!r}"
        time.sleep(0.3)


@contextlib.contextmanager
def slurm_cluster(factory: Any, **options: Any) -> Iterator[SlurmBox]:
    """A started SlurmBox (`options` as SlurmBox takes them) in a new folder of pytest's
    `tmp_path_factory`, closed on exit: a module's fixture. Fails where the machine cannot
    make namespaces (tests/run.sh installs what they need), never skips."""
    netns.require()
    with SlurmBox(factory.mktemp("slurm") / "box", **options) as box:
        yield box


class SlurmBox:
    """The cluster of the module docstring under `root`. `start()` (or `with`), always
    `close()`. `partitions` maps a partition name to its compute hosts ("c1", ...); the first
    is the default. `gpus` is the GPUs of each compute host (0: none, no GRES). `login_path`
    replaces the PATH of SSH sessions on the login host (a login host without Slurm's
    commands); `login_env` adds variables to them (and so to the jobs submitted there);
    `no_gpus` names compute hosts without GPUs (a CPU partition's). `tiers` gives partitions a
    PriorityTier: with any, a job of a higher tier preempts those of lower ones on its nodes
    (PreemptType=preempt/partition_prio, PreemptMode=REQUEUE: a job that may not be requeued,
    as sbatch --no-requeue makes it, is cancelled instead; slurm.conf(5), Slurm's preempt
    guide)."""

    def __init__(
        self,
        root: Path,
        computes: int = 3,
        gpus: int = 2,
        partitions: dict[str, list[str]] | None = None,
        cpus: int = 2,
        login_path: str | None = None,
        login_env: dict[str, str] | None = None,
        no_gpus: tuple[str, ...] = (),
        tiers: dict[str, int] | None = None,
    ) -> None:
        self.root = root
        self.computes = [f"c{i}" for i in range(1, computes + 1)]
        self.gpus, self.cpus = gpus, cpus
        self.login_path = login_path  # the PATH of SSH sessions on the login host (None: sshd's)
        # more variables of SSH sessions on the login host, which sbatch passes on to the jobs
        # (--export=ALL): a test harness's, as CT_ALLOW_NO_GPU=1 on a cluster without GPUs
        self.login_env = dict(login_env or {})
        self.no_gpus = no_gpus  # compute hosts without GPUs (a CPU partition's)
        self.tiers = dict(tiers or {})  # partition -> PriorityTier (preemption between them)
        self.partitions = partitions or {"gpu" if gpus else "cpu": list(self.computes)}
        self.network: Network | None = None
        self.hosts: dict[str, Host] = {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self.user = "root"
        self.key = root / "ssh" / "id_ed25519"  # the user's key, authorized on the login host
        self.known_hosts = root / "ssh" / "known_hosts"  # the login host's key, as ssh saw it

    # --- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> SlurmBox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> SlurmBox:
        """Make the hosts, write the configs, start every daemon and wait until every compute
        host is idle (or up to START_TIMEOUT_S: SlurmError). Blocks; not idempotent."""
        lacking = missing()
        if lacking:
            raise SlurmError(f"the Slurm box needs {', '.join(lacking)}: run tests/run.sh")
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
        for folder in ("etc", "munge", "spool", "state", "dev", "log", "ssh"):
            (self.root / folder).mkdir(parents=True)
        self.network = Network()
        for name in ("login", "ctl", *self.computes):
            self.hosts[name] = self.network.add_host(f"slurm-{name}")
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for i in range(self.gpus):
            os.mknod(
                self.root / "dev" / f"nvidia{i}", 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, i)
            )
        for name, host in self.hosts.items():
            self._write_conf(name)
            self._spawn(name, host, [
                "munged", "-F", "--force", f"--socket={self._socket(name)}",
                f"--key-file={key}", f"--pid-file={self.root}/munge/{name}.pid",
                f"--log-file={self.root}/log/munged-{name}.log",
                f"--seed-file={self.root}/munge/{name}.seed",
            ], "munged")  # fmt: skip
        self._wait(lambda: all(self._socket(n).exists() for n in self.hosts), "munged")
        self._daemon("ctl", "slurmctld", "-D")
        for name in self.computes:
            self._daemon(name, "slurmd", "-D", "-N", name)
        self._start_sshd()
        self._wait(self._all_idle, "every compute host idle")

    def close(self) -> None:
        """Kill every daemon and job step, delete the hosts and the box's folder. Idempotent;
        blocks."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._procs.clear()
        if self.network is not None:
            self.network.close()  # kills whatever is left in each namespace (job steps)
            self.network = None
        self.hosts.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    # --- use ---------------------------------------------------------------------------------

    @property
    def login_ip(self) -> str:
        return self.hosts["login"].ip

    def ssh_args(self, *options: str) -> list[str]:
        """`ssh` to the login host as the box's user with its key and known host key, in batch
        mode (no prompt); `options` go first (ssh takes an option's first value); the remote
        command goes after."""
        return [
            "ssh", *options, "-i", str(self.key), "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=10", f"{self.user}@{self.login_ip}",
        ]  # fmt: skip

    def ssh(self, *command: str, check: bool = True, timeout: float = 60) -> str:
        """Run `command` on the login host over SSH; its stdout. SlurmError (with stderr) when
        it fails and `check`. Blocks."""
        done = subprocess.run(
            [*self.ssh_args(), shlex.join(command)],  # one string: the login shell splits it
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr[-2000:]}")
        return done.stdout

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job of the box's user and wait until the queue is empty. Blocks."""
        self.ssh("scancel", f"--user={self.user}")
        wait_for("an empty queue", lambda: self.ssh("squeue", "-h").strip() == "", timeout=timeout)

    def set_state(self, node: str, state: str, reason: str = "cloudtrain box") -> None:
        """`scontrol update NodeName=<node> State=<state>` as the cluster's administrator."""
        self.ssh("scontrol", "update", f"NodeName={node}", f"State={state}", f"Reason={reason}")

    def node_states(self) -> dict[str, str]:
        """Compute host -> its state as sinfo shows it (idle, alloc, down*, ...)."""
        out = self.ssh("sinfo", "-h", "-N", "-o", "%N %T")
        return dict(line.split() for line in out.splitlines() if line.strip())

    # --- inside ------------------------------------------------------------------------------

    def _socket(self, name: str) -> Path:
        return self.root / "munge" / f"{name}.socket"

    def _conf_path(self, name: str) -> Path:
        return self.root / "etc" / name / "slurm.conf"

    def _write_conf(self, name: str) -> None:
        folder = self.root / "etc" / name
        folder.mkdir(parents=True, exist_ok=True)
        gpu_hosts = [n for n in self.computes if self.gpus and n not in self.no_gpus]
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={self.hosts[n].ip} CPUs={self.cpus} RealMemory=1000"
            f"{f' Gres=gpu:{self.gpus}' if n in gpu_hosts else ''} State=UNKNOWN"
            for n in self.computes
        )
        parts = "\n".join(
            f"PartitionName={p} Nodes={','.join(hosts)} Default={'YES' if i == 0 else 'NO'}"
            " MaxTime=INFINITE State=UP"
            + (f" PriorityTier={self.tiers[p]}" if p in self.tiers else "")
            for i, (p, hosts) in enumerate(self.partitions.items())
        )
        preempt = "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE" if self.tiers else ""
        r = self.root
        (folder / "slurm.conf").write_text(f"""ClusterName=ctbox
SlurmctldHost=ctl({self.hosts["ctl"].ip})
AuthType=auth/munge
AuthInfo=socket={self._socket(name)}
CredType=cred/munge
DebugFlags=NO_CONF_HASH
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmUser=root
SlurmdUser=root
SlurmctldPidFile={r}/state/slurmctld.pid
SlurmdPidFile={r}/spool/slurmd-%n.pid
SlurmdSpoolDir={r}/spool/%n
StateSaveLocation={r}/state
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ReturnToService=1
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/filetxt
JobCompLoc={r}/state/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
SlurmctldTimeout=30
SlurmdTimeout=30
{preempt}
{"GresTypes=gpu" if self.gpus else ""}
{nodes}
{parts}
""")
        if self.gpus:
            last = self.gpus - 1
            devices = f"{r}/dev/nvidia[0-{last}]" if last else f"{r}/dev/nvidia0"
            hosts = ",".join(gpu_hosts)
            (folder / "gres.conf").write_text(f"NodeName={hosts} Name=gpu File={devices}\n")
        (folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _spawn(self, name: str, host: Host, args: list[str], daemon: str) -> None:
        log = (self.root / "log" / f"{name}-{daemon}.out").open("ab")
        env = {**os.environ, "SLURM_CONF": str(self._conf_path(name))}
        self._procs.append(host.popen(args, stdout=log, stderr=subprocess.STDOUT, env=env))
        log.close()

    def _daemon(self, name: str, *args: str) -> None:
        """`args` on host `name` under its own host name (unshare --uts), with its slurm.conf."""
        command = " ".join([*args, "-f", str(self._conf_path(name))])
        self._spawn(
            name,
            self.hosts[name],
            ["unshare", "--uts", "sh", "-c", f"hostname {name} && exec {command}"],
            args[0],
        )

    def _start_sshd(self) -> None:
        ssh = self.root / "ssh"
        for key in (ssh / "host_ed25519", self.key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                check=True,
                timeout=30,
            )
        (ssh / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        host_key = Path(f"{ssh}/host_ed25519.pub").read_text().split()
        self.known_hosts.write_text(f"{self.login_ip} {host_key[0]} {host_key[1]}\n")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
        env = {**({"PATH": self.login_path} if self.login_path else {}), **self.login_env}
        extra = "".join(f" {k}={v}" for k, v in env.items())
        (ssh / "sshd_config").write_text(f"""ListenAddress {self.login_ip}
Port 22
HostKey {ssh}/host_ed25519
AuthorizedKeysFile {ssh}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile {ssh}/sshd.pid
SetEnv SLURM_CONF={self._conf_path("login")}{extra}
""")
        self._spawn(
            "login",
            self.hosts["login"],
            ["/usr/sbin/sshd", "-D", "-e", "-f", f"{ssh}/sshd_config"],
            "sshd",
        )

    def _all_idle(self) -> bool:
        env = {**os.environ, "SLURM_CONF": str(self._conf_path("login"))}
        done = self.hosts["login"].run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=env
        )
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return sorted(states) == sorted(self.computes) and set(states.values()) == {"idle"}

    def _wait(self, check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not check():
            if any(p.poll() is not None for p in self._procs):
                logs = "\n".join(
                    f"{p.name}: {p.read_text(errors='replace')[-800:]}"
                    for p in sorted((self.root / "log").glob("*"))
                )
                raise SlurmError(f"a daemon of the Slurm box exited before {what}:\n{logs}")
            if time.monotonic() > deadline:
                raise SlurmError(f"the Slurm box: not in {START_TIMEOUT_S:.0f} s: {what}")
            time.sleep(0.3)
