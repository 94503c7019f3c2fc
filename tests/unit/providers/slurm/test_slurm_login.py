"""providers/slurm/login.py against the Slurm box's real sshd and Slurm (tests/fakes/
slurm_box.py): a command runs on the login host with its words intact; a host key that is
unknown or changed, a key the host refuses, a host that does not answer, a command the login
host lacks and a command that fails each give one clear error, the untrusted stderr escaped."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.core.errors import CredentialsError, ProviderError
from cloudtrain.providers.base import NodeRequest, RunInfo
from cloudtrain.providers.slurm import login as login_module
from cloudtrain.providers.slurm import ssh_mux
from cloudtrain.providers.slurm.compute import SlurmCompute
from cloudtrain.providers.slurm.login import LoginHost, run_on_login
from cloudtrain.providers.slurm.times import in_utc
from tests.fakes import netns
from tests.fakes.slurm_box import SlurmBox, slurm_cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBox]:
    with slurm_cluster(tmp_path_factory, computes=1, gpus=0) as box:
        yield box


def login_of(box: SlurmBox, **changes: object) -> LoginHost:
    fields: dict[str, object] = {
        "host": box.login_ip,
        "user": box.user,
        "key": box.key,
        "known_hosts": box.known_hosts,
    }
    fields.update(changes)
    return LoginHost(**fields)  # type: ignore[arg-type]


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and "\x1b" not in text, text
    return text


def test_a_command_runs_on_the_login_host_with_its_words_intact(cluster: SlurmBox) -> None:
    login = login_of(cluster)
    assert run_on_login(login, ["sinfo", "-h", "-o", "%D %T"]) == "1 idle\n"
    assert (
        run_on_login(login, ["echo", "a  b", "$HOME", "'q'", ";", "true"])
        == "a  b $HOME 'q' ; true\n"
    )


def test_an_unknown_host_key_is_refused_never_accepted(cluster: SlurmBox, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(CredentialsError) as caught:
        run_on_login(login_of(cluster, known_hosts=empty), ["sinfo"])
    assert caught.value.codes == {"host-key"}
    assert f"root@{cluster.login_ip}: its SSH host key is not in {empty}" in one_line(caught.value)
    assert "ssh-keyscan -p 22" in str(caught.value)
    assert empty.read_text() == "", "nothing was added to known_hosts"


def test_a_changed_host_key_is_refused(cluster: SlurmBox, tmp_path: Path) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, blob = Path(f"{other}.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"{cluster.login_ip} {kind} {blob}\n")
    with pytest.raises(CredentialsError) as caught:
        run_on_login(login_of(cluster, known_hosts=known), ["sinfo"])
    assert caught.value.codes == {"host-key"}


def test_a_key_the_host_does_not_know_is_refused(cluster: SlurmBox, tmp_path: Path) -> None:
    stranger = tmp_path / "id_stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(CredentialsError) as caught:
        run_on_login(login_of(cluster, key=stranger), ["sinfo"])
    assert caught.value.codes == {"key-refused"}
    assert f"root@{cluster.login_ip} refused the SSH key {stranger}" in one_line(caught.value)
    assert "Permission denied" in str(caught.value)


def test_a_host_that_does_not_answer(cluster: SlurmBox) -> None:
    with pytest.raises(ProviderError) as caught:
        run_on_login(login_of(cluster, port=2), ["sinfo"])
    assert caught.value.codes == {"unreachable"}
    assert "the login host cannot be reached" in one_line(caught.value)
    assert "Connection refused" in str(caught.value)


def test_a_login_host_without_sbatch(tmp_path: Path) -> None:
    netns.require()
    # the login host's PATH: squeue and the shell's tools, but no sbatch
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "mkdir", "ls", "tar"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or tool)
    with SlurmBox(tmp_path / "box", computes=1, gpus=0, login_path=str(bin_dir)) as bare:
        with pytest.raises(ProviderError) as caught:
            run_on_login(login_of(bare), ["sbatch", "--wrap", "true"])
        assert caught.value.codes == {"not-found"}
        text = one_line(caught.value)
        assert "`sbatch` is not on the login host's PATH: is this a Slurm login node?" in text
        # run under TZ=UTC0 (times.in_utc): still the command env did not find
        with pytest.raises(ProviderError) as caught:
            run_on_login(login_of(bare), in_utc(["sbatch", "--test-only", "--wrap", "true"]))
        assert "`sbatch` is not on the login host's PATH" in one_line(caught.value)
        # a script of ours missing another tool: the one its shell named
        with pytest.raises(ProviderError) as caught:
            run_on_login(login_of(bare), ["/bin/sh", "-c", "mktemp -d", "sh"], what="a folder")
        assert "`mktemp` is not on the login host's PATH" in one_line(caught.value)
        # the compute's submit, a script of its own, names sbatch too
        compute = SlurmCompute(login_of(bare), str(tmp_path / "shared"))
        run = RunInfo("digits-0a1b2c", None, None, (20000, 20100))
        request = NodeRequest("digits-0a1b2c", "chief", 0, "cpu", "#!/bin/bash\ntrue\n")
        with pytest.raises(ProviderError) as caught:
            compute.create_nodes(run, [request])
        assert "`sbatch` is not on the login host's PATH" in one_line(caught.value)
        assert bare.ssh("squeue", "-h", check=False) == ""  # nothing was submitted


def test_a_failing_command_shows_its_last_stderr_line_escaped(cluster: SlurmBox) -> None:
    with pytest.raises(ProviderError) as caught:
        run_on_login(login_of(cluster), ["squeue", "-h", "-j", "999999"])
    assert caught.value.codes == {"exit-1"}
    assert "`squeue -h -j 999999` exited 1: slurm_load_jobs error: Invalid job id" in one_line(
        caught.value
    )
    script = "printf 'first\\n\\033[2Jcleared\\n' >&2; exit 3"
    with pytest.raises(ProviderError) as caught:
        run_on_login(login_of(cluster), ["bash", "-c", script])
    assert one_line(caught.value).endswith("exited 3: \\x1b[2Jcleared")


def test_output_over_the_bound_is_an_error(
    cluster: SlurmBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(login_module, "MAX_OUTPUT_BYTES", 10)
    assert run_on_login(login_of(cluster), ["echo", "123456789"]) == "123456789\n"
    with pytest.raises(ProviderError, match="wrote 11 bytes, over the 10 cloudtrain reads"):
        run_on_login(login_of(cluster), ["echo", "1234567890"])


# -- one connection for a login's commands (providers/slurm/ssh_mux.py) -------------------------


def _client_port(login: LoginHost) -> str:
    """The client's port of the connection that carried the command (sshd's SSH_CONNECTION:
    client address, client port, server address, server port)."""
    return run_on_login(login, ["sh", "-c", 'echo "$SSH_CONNECTION"']).split()[1]


def _master_pid(login: LoginHost) -> int | None:
    """The pid of the login's connection master (`ssh -O check`), None when none runs."""
    argv = login.ssh_argv()
    done = subprocess.run(
        [argv[0], "-O", "check", *argv[1:]], capture_output=True, text=True, check=False
    )
    found = re.search(r"Master running \(pid=(\d+)\)", done.stderr)
    return int(found[1]) if found else None


def test_the_commands_of_a_login_share_one_connection(cluster: SlurmBox, tmp_path: Path) -> None:
    # a login of its own (its known_hosts copy names it): no master from another test
    known = tmp_path / "known_hosts"
    known.write_bytes(cluster.known_hosts.read_bytes())
    login = login_of(cluster, known_hosts=known)
    first = _client_port(login)
    assert _client_port(login) == first == _client_port(login), "one connection, reused"
    master = _master_pid(login)
    assert master is not None
    # a master that died (a crash, a closed lid) leaves its socket: the next command makes
    # a new connection, and a new master
    os.kill(master, signal.SIGKILL)
    assert _client_port(login) != first
    assert _master_pid(login) not in (None, master)
    # another key or host key check is another login: never the same connection
    assert _client_port(login_of(cluster)) != _client_port(login)


def test_the_users_own_sharing_settings_win(cluster: SlurmBox, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_bytes(cluster.known_hosts.read_bytes())
    off = login_of(cluster, known_hosts=known, options=("ControlMaster=no",))
    assert _client_port(off) != _client_port(off), "sharing turned off: a connection each"
    theirs = tmp_path / "cm"
    own = login_of(
        cluster,
        known_hosts=known,
        options=("ControlMaster=auto", f"ControlPath={theirs}", "ControlPersist=5"),
    )
    assert [w for w in own.ssh_argv() if w.startswith("ControlPath=")] == [f"ControlPath={theirs}"]
    assert _client_port(own) == _client_port(own)
    assert theirs.is_socket(), "their master, at their path"


def test_no_sharing_through_a_folder_others_may_enter(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["ssh", "-p", "22", "-o", "BatchMode=yes", "--", "someone@login.example"]
    # a short temp folder of its own: a socket's path has a bound (pytest's tmp_path is long)
    tmp_path = Path(tempfile.mkdtemp(prefix="ct-mux-"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    words = ssh_mux.mux_options(argv)
    folder = ssh_mux.socket_dir()
    assert f"ControlPath={folder}/" in " ".join(words)
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o733)  # others may enter, and place a socket of their own there
    assert ssh_mux.mux_options(argv) == []
    folder.chmod(0o700)
    assert ssh_mux.mux_options(argv) == words
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("x" * 90)))  # sun_path's bound
    (tmp_path / ("x" * 90)).mkdir()
    assert ssh_mux.mux_options(argv) == []
    shutil.rmtree(tmp_path)
