"""A command on a Slurm cluster's login host, over SSH, the way its user runs one by hand:
OpenSSH's `ssh` client with the user's key, in batch mode (never a prompt: no password, no
passphrase, no "accept this host key?"), the host key checked against known_hosts (never
accepted blindly: an unknown or changed key is refused). The remote command is one string,
every word quoted (`shlex.join`), as the login shell splits it.

What comes back is untrusted: stdout is bounded (MAX_OUTPUT_BYTES) and read as UTF-8 with
U+FFFD for what is not; what an error shows of stderr is one bounded line with every control
character escaped (cloudtrain/core/node_text.py).

Failures, each one error naming the host (ssh(1): exit 255 is ssh's own, any other the remote
command's; bash's 127 is "command not found"):
- the host key unknown or changed: CredentialsError, hint: check its fingerprint, then
  ssh-keyscan into known_hosts;
- the key refused ("Permission denied (publickey)"), or a key file that cannot be read:
  CredentialsError;
- the host unreachable (no such name, refused, timed out): ProviderError; a connection the
  host reset or closed before the command ran (sshd's MaxStartups drops connections past 10
  unauthenticated at once, sshd_config(5)): TransientError, which the retry layer retries;
- the command missing on the login host (exit 127): ProviderError naming it ("is this a Slurm
  login node?");
- any other non-zero exit: ProviderError with the command and the last line it wrote to stderr.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cloudtrain.core.errors import CredentialsError, ProviderError, TransientError
from cloudtrain.core.node_text import shown
from cloudtrain.providers.slurm.ssh_mux import mux_options

MAX_OUTPUT_BYTES = 4 * 1024 * 1024  # of one command's stdout; more is an error, not a cut
STDERR_KEPT_BYTES = 64 * 1024  # of one command's stderr, its end
SSH_FAILED = 255  # ssh(1): "exits with 255 if an error occurred" (its own, not the command's)
NOT_FOUND = 127  # the login shell: the command is not on the PATH
# how dash and bash say it: "sh: 1: NAME: not found", "bash: line 1: NAME: command not found"
_NOT_FOUND_LINE = re.compile(r"(?:^|: )([A-Za-z0-9_.+-]{1,64}): (?:command )?not found$")
_UNREACHABLE = (
    "Could not resolve hostname",
    "Connection refused",
    "Connection timed out",
    "No route to host",
    "Network is unreachable",
)
# the connection went before the command ran: a busy sshd (MaxStartups), worth another try
_DROPPED = ("Connection reset by", "Connection closed by", "kex_exchange_identification")
# commands one process runs on one login host at once: sessions on the login's shared
# connection (ssh_mux.py), below sshd's MaxSessions (default 10 per connection), or, unshared,
# connections, below sshd's MaxStartups (default 10:30:100: past 10 unauthenticated
# connections, new ones are dropped at random)
MAX_CONNECTIONS = 4
_SLOTS: dict[tuple[str, int, str], threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def _slot(login: LoginHost) -> threading.BoundedSemaphore:
    """The semaphore that bounds this process's connections to `login`'s host."""
    with _SLOTS_LOCK:
        return _SLOTS.setdefault(
            (login.host, login.port, login.user), threading.BoundedSemaphore(MAX_CONNECTIONS)
        )


@dataclass(frozen=True)
class LoginHost:
    """Where and as whom: `user@host:port` with the private key `key` (None: ssh's own default
    keys and agent), the host keys in `known_hosts` (None: ssh's ~/.ssh/known_hosts), and
    extra `-o Name=value` options (a ProxyJump, say)."""

    host: str
    user: str
    key: Path | None = None
    port: int = 22
    known_hosts: Path | None = None
    options: tuple[str, ...] = field(default=())
    connect_timeout_s: int = 15

    @property
    def where(self) -> str:
        port = f":{self.port}" if self.port != 22 else ""
        return f"{self.user}@{self.host}{port}"

    def ssh_argv(self) -> list[str]:
        """The `ssh` command line up to the remote command. Blocks the first time for a login
        (ssh_mux: one local `ssh -G`)."""
        argv = ["ssh", "-p", str(self.port), "-o", "BatchMode=yes"]
        argv += [
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ConnectTimeout={self.connect_timeout_s}",
        ]
        if self.key is not None:
            argv += ["-i", str(self.key), "-o", "IdentitiesOnly=yes"]
        if self.known_hosts is not None:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        for option in self.options:
            argv += ["-o", option]
        argv += ["--", f"{self.user}@{self.host}"]
        # one connection for every command of this login (providers/slurm/ssh_mux.py)
        return [*argv[:-2], *mux_options(argv), *argv[-2:]]


def run_on_login(
    login: LoginHost,
    command: Sequence[str],
    *,
    timeout_s: float = 120,
    stdin: bytes = b"",
    what: str | None = None,
) -> str:
    """Run `command` (its words) on the login host; its stdout. Blocks up to `timeout_s` (then
    ProviderError; the remote command may go on). Not idempotent by itself: the command
    decides. Raises CredentialsError or ProviderError as the module docstring says; their
    messages name the command as `what` when given (a script's purpose, not its text)."""
    return run_on_login_both(login, command, timeout_s=timeout_s, stdin=stdin, what=what)[0]


def run_on_login_both(
    login: LoginHost,
    command: Sequence[str],
    *,
    timeout_s: float = 120,
    stdin: bytes = b"",
    what: str | None = None,
) -> tuple[str, str]:
    """`run_on_login`, with what the command wrote to stderr too (bounded to its last 64 KiB,
    as text): for the commands that answer there (`sbatch --test-only`). Blocks; raises as
    `run_on_login`."""
    out, err, _ = run_on_login_raw(login, command, timeout_s=timeout_s, stdin=stdin, what=what)
    return out.decode("utf-8", errors="replace"), err.decode("utf-8", errors="replace")


def run_on_login_raw(
    login: LoginHost,
    command: Sequence[str],
    *,
    timeout_s: float = 120,
    stdin: bytes | Path = b"",
    stdout_to: Path | None = None,
    what: str | None = None,
    max_bytes: int | None = None,
    accept: Collection[int] = (),
) -> tuple[bytes, bytes, int]:
    """`run_on_login` as bytes: (stdout, the last 64 KiB of stderr, the exit status). `stdin`
    is the bytes to send or a file to stream; with `stdout_to`, stdout streams into that file
    (unbounded: the caller's file) and b"" comes back; otherwise more than `max_bytes` of it
    (None: MAX_OUTPUT_BYTES) is an error. An exit status in `accept` (the command's own
    answers) comes back instead of raising. Blocks; raises as `run_on_login`."""
    if not command:
        raise ValueError("no command")
    remote = shlex.join(command)
    shown_as = what or remote
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(open(stdin, "rb")) if isinstance(stdin, Path) else None
        sink = stack.enter_context(open(stdout_to, "wb")) if stdout_to is not None else None
        try:
            with _slot(login):
                done = subprocess.run(
                    [*login.ssh_argv(), remote],
                    input=None if source is not None else stdin,
                    stdin=source,
                    stdout=sink if sink is not None else subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    timeout=timeout_s,
                    check=False,
                )
        except FileNotFoundError as exc:
            raise ProviderError(
                "the Slurm provider needs OpenSSH's ssh client on this machine",
                hint="install openssh-client",
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise ProviderError(
                f"{login.where}: `{shown(shown_as, 200)}` took over {timeout_s:.0f} s"
            ) from exc
    if done.returncode != 0 and done.returncode not in accept:
        raise _failure(login, command, shown_as, done.returncode, done.stderr)
    stdout = done.stdout or b""
    max_bytes = MAX_OUTPUT_BYTES if max_bytes is None else max_bytes
    if len(stdout) > max_bytes:
        raise ProviderError(
            f"{login.where}: `{shown(shown_as, 200)}` wrote {len(stdout)} bytes, over the "
            f"{max_bytes} cloudtrain reads"
        )
    return stdout, done.stderr[-STDERR_KEPT_BYTES:], done.returncode


# the exit statuses of the remote command itself (not ssh's 255, not the shell's 127)
_COMMAND_EXITS = frozenset(range(1, 255)) - {SSH_FAILED, NOT_FOUND}


def run_unless_said(
    login: LoginHost, command: Sequence[str], said: Sequence[str], *, timeout_s: float = 120
) -> str | None:
    """`run_on_login`, except that a command that fails having written one of `said` to
    stderr (its own answer, as scancel's "Invalid job id specified") gives None. Blocks;
    raises as `run_on_login` for any other failure."""
    out, err, code = run_on_login_raw(login, command, timeout_s=timeout_s, accept=_COMMAND_EXITS)
    if code == 0:
        return out.decode("utf-8", errors="replace")
    if any(answer in err.decode("utf-8", errors="replace") for answer in said):
        return None
    raise _failure(login, command, shlex.join(command), code, err)


def _missing(command: Sequence[str], shown_as: str, stderr: bytes = b"") -> str:
    """The command the login shell did not find: the first word, or for a shell script of
    ours (`/bin/sh -c`), the one its shell named ("sh: 1: mktemp: not found"), else the first
    word of what it is shown as (its purpose: "sbatch"). Pure."""
    if command[0] in ("sh", "/bin/sh") and list(command[1:2]) == ["-c"]:
        found = _NOT_FOUND_LINE.search(_last_line(stderr))
        return found[1] if found else shown_as.split(" ", 1)[0]
    if command[0] in ("env", "/usr/bin/env"):  # `env NAME=VALUE command ...` (times.in_utc)
        return next((word for word in command[1:] if "=" not in word), "env")
    return command[0]


def _last_line(stderr: bytes) -> str:
    lines = [
        line
        for line in stderr[-8192:].decode("utf-8", errors="replace").splitlines()
        if line.strip()
    ]
    return shown(lines[-1], 300) if lines else "(nothing on stderr)"


def _failure(
    login: LoginHost, command: Sequence[str], remote: str, code: int, stderr: bytes
) -> Exception:
    text = stderr[-8192:].decode("utf-8", errors="replace")
    where = login.where
    if code == SSH_FAILED:
        if (
            "Host key verification failed" in text
            or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text
        ):
            known = login.known_hosts or "~/.ssh/known_hosts"
            return CredentialsError(
                f"{where}: its SSH host key is not in {known}, or differs from the one there: "
                "cloudtrain never accepts a host key it has not been given",
                hint=f"check the key's fingerprint with the cluster's admins, then "
                f"`ssh-keyscan -p {login.port} {login.host} >> {known}`",
                codes=frozenset({"host-key"}),
            )
        if "Permission denied" in text or "Load key" in text or "no such identity" in text:
            return CredentialsError(
                f"{where} refused the SSH key {login.key or '(ssh default keys)'}: "
                f"{_last_line(stderr)}",
                hint="the key's public half must be in the user's ~/.ssh/authorized_keys on the "
                "login host; a key with a passphrase needs ssh-agent",
                codes=frozenset({"key-refused"}),
            )
        if any(marker in text for marker in _DROPPED):
            return TransientError(
                f"{where}: the login host dropped the connection: {_last_line(stderr)}",
                codes=frozenset({"dropped"}),
            )
        if any(marker in text for marker in _UNREACHABLE):
            return ProviderError(
                f"{where}: the login host cannot be reached: {_last_line(stderr)}",
                codes=frozenset({"unreachable"}),
            )
        return ProviderError(f"ssh to {where} failed: {_last_line(stderr)}")
    if code == NOT_FOUND:
        return ProviderError(
            f"{where}: `{shown(_missing(command, remote, stderr), 100)}` is not on the login "
            "host's PATH: is this a Slurm login node?",
            hint="cloudtrain runs the cluster's own commands (sbatch, squeue, sacct, scancel, "
            "scontrol, sinfo) there",
            codes=frozenset({"not-found"}),
        )
    return ProviderError(
        f"{where}: `{shown(remote, 200)}` exited {code}: {_last_line(stderr)}",
        codes=frozenset({f"exit-{code}"}),
    )
