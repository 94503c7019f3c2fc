"""One SSH connection to a login host, shared by every command this machine runs there.

A run talks to its cluster all the time: the queue, the bucket's keys, the nodes' logs, each
one `ssh` command. Each command on a connection of its own pays a key exchange and a login, and
a login host counts them: sshd drops new connections past `MaxStartups` unauthenticated ones at
once (sshd_config(5), default 10:30:100), and sites rate-limit logins. OpenSSH's connection
sharing (ssh_config(5): ControlMaster, ControlPath, ControlPersist) makes the first command's
connection a master in the background, which the next commands use; the master leaves
CONTROL_PERSIST_S seconds after its last command.

Never in the user's way:
- a user whose ssh config (~/.ssh/config, or `providers.slurm.options`) already sets
  ControlMaster or ControlPath keeps theirs: a login host behind a second factor, say, that the
  user opens a master to by hand. `ssh -G` says what is in effect (no connection is made);
  `options: [ControlMaster=no]` turns sharing off;
- the sockets live in a folder only this user may enter (made 0700, its owner and mode
  checked); one that is not (another user's, or open to others) means no sharing: a socket there
  would hand the login to whoever can reach it;
- each socket is for one way to log in: the host, port, user, key, known_hosts and options all
  name it, so a command never rides a connection made with another key or host key check.
Without sharing, every command opens its own connection, as before.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

CONTROL_PERSIST_S = 60  # the master's life after its last command
# a master whose host stopped answering ends after ~45 s, and its clients with it
KEEPALIVE = ("ServerAliveInterval=15", "ServerAliveCountMax=3")
SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux, 104 on macOS


def socket_dir() -> Path:
    """The folder of this user's control sockets: `<tmp>/cloudtrain-ssh-<uid>`. Pure."""
    return Path(tempfile.gettempdir()) / f"cloudtrain-ssh-{os.getuid()}"


def private_dir(path: Path) -> bool:
    """Make `path` (0700) if missing; whether it is a real folder owned by this user that no
    one else may enter. Idempotent; never raises."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def mux_options(argv: Sequence[str]) -> list[str]:
    """The `-o` words that make `argv` (ssh's command line up to its destination,
    `ssh ... -- user@host`) share one connection with every other command of the same
    `argv`; [] when the user's own config sets sharing or no private socket folder can be had.
    They go after the user's options: ssh takes the first value it is given, so an option of
    the user's wins. Blocks once per `argv` (one local `ssh -G`, no connection); never
    raises."""
    if _user_sets_sharing(tuple(argv)):
        return []
    folder = socket_dir()
    if not private_dir(folder):
        return []
    path = folder / hashlib.sha256("\0".join(argv).encode()).hexdigest()[:24]
    if len(str(path)) > SOCKET_PATH_MAX:
        return []
    words = [
        "ControlMaster=auto",
        f"ControlPath={path}",
        f"ControlPersist={CONTROL_PERSIST_S}",
        *KEEPALIVE,
    ]
    return [w for word in words for w in ("-o", word)]


@functools.lru_cache(maxsize=64)
def _user_sets_sharing(argv: tuple[str, ...]) -> bool:
    """Whether ssh's config in effect for `argv` (`ssh -G`: its options and ~/.ssh/config)
    shares connections already: a ControlMaster other than `no`, or a ControlPath. An ssh that
    cannot say: True (ssh is left as it is). Blocks (a local process, no connection)."""
    try:
        done = subprocess.run(
            [argv[0], "-G", *argv[1:]], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return True
    if done.returncode != 0:
        return True
    said = dict(
        line.split(" ", 1)
        for line in done.stdout.decode(errors="replace").splitlines()
        if " " in line
    )
    return said.get("controlmaster", "false") != "false" or "controlpath" in said
