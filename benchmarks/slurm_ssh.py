"""Commands on a Slurm login host over one shared SSH connection, against one each.

The Slurm box (tests/fakes/slurm_box.py: a real sshd and Slurm in network namespaces) runs
`N` short commands (`squeue -h`, what the controller's poll runs most) through
providers/slurm/login.run_on_login twice, alternating, per round: with the login's connection
shared (providers/slurm/ssh_mux.py; the first command of a round opens the master, so each
round starts from a closed one) and with `ControlMaster=no` (a connection per command, as
before). Figures: the median seconds of one command each way, and the connections the login
host saw for N shared commands (distinct client ports in sshd's SSH_CONNECTION: 1).
Needs what tests/run.sh installs (slurm, munge, openssh-server) and root for the namespaces.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, bench_home, figure, info, median, result

sys.path.insert(0, str(REPO))

from cloudtrain.providers.slurm.login import LoginHost, run_on_login
from tests.fakes.slurm_box import SlurmBox


def _login(box: SlurmBox, known: Path, *options: str) -> LoginHost:
    return LoginHost(
        host=box.login_ip, user=box.user, key=box.key, known_hosts=known, options=options
    )


def _close(login: LoginHost) -> None:
    """End the login's master, if one runs (`ssh -O exit`)."""
    argv = login.ssh_argv()
    subprocess.run([argv[0], "-O", "exit", *argv[1:]], capture_output=True, check=False)


def _timed(login: LoginHost, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run_on_login(login, ["squeue", "-h"])
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="commands per round and way")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ok = True
    with bench_home("slurm_ssh"), tempfile.TemporaryDirectory() as tmp:
        with SlurmBox(Path(tmp) / "box", computes=1, gpus=0) as box:
            known = Path(tmp) / "known_hosts"
            known.write_bytes(box.known_hosts.read_bytes())
            shared, unshared = _login(box, known), _login(box, known, "ControlMaster=no")
            each: dict[str, list[float]] = {"shared": [], "unshared": []}
            for _ in range(args.rounds):
                _close(shared)
                each["shared"] += _timed(shared, args.n)
                each["unshared"] += _timed(unshared, args.n)
            _close(shared)
            ports = {
                run_on_login(shared, ["sh", "-c", 'echo "$SSH_CONNECTION"']).split()[1]
                for _ in range(args.n)
            }
            _close(shared)
        for way, times in each.items():
            info(f"{way}: {len(times)} commands, {sum(times):.1f} s in all")
        figure("slurm_cmd_unshared_s", median(each["unshared"]), n=len(each["unshared"]))
        ok &= result(
            "slurm_cmd_shared_s", median(each["shared"]), median(each["unshared"]),
            n=len(each["shared"]), digits=3,
        )  # fmt: skip
        ok &= result(f"slurm_connections_per_{args.n}", len(ports), 1, op="==", stat="value")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
