"""The Slurm provider: a cluster reached through its login host (`providers.slurm` options).

On the controller (options name a `host`): the compute is `SlurmCompute` and the bucket a
`SlurmStore`, both through the login host. On the cluster (a node opens its store by URI with
no options): the bucket is the shared folder itself. A bucket in an object store the cluster
reaches (s3://, gs://, az://) is that cloud's store on both sides. Nothing here is installed
on the cluster by an administrator; cloudtrain runs the cluster's own commands and Python.
"""

from __future__ import annotations

import getpass
import threading
from pathlib import Path

from cloudtrain.core.errors import UsageError
from cloudtrain.providers.base import ObjectStore, Provider, ProviderConfig
from cloudtrain.providers.registry import plain_store
from cloudtrain.providers.slurm.compute import SlurmCompute
from cloudtrain.providers.slurm.login import LoginHost, run_on_login
from cloudtrain.providers.slurm.storage import SCHEME, SlurmStore, node_store, uri_of

DEFAULT_WORKDIR = "cloudtrain"  # the options' default (options.py): under the user's home
BUCKET_FOLDER = "bucket"  # under the workdir: the runs' bucket when the spec names none


class SlurmProvider(Provider):
    """A Slurm cluster as a provider. Creates nothing until asked; thread-safe."""

    name = "slurm"

    def __init__(self, config: ProviderConfig | None = None) -> None:
        super().__init__(config or ProviderConfig(name="slurm"))
        self._compute: SlurmCompute | None = None
        self._workdir_path: str | None = None
        self._lock = threading.Lock()

    def login(self) -> LoginHost | None:
        """The login host the options name, or None (on the cluster: no options). Pure."""
        host = self.config.option("host")
        if host is None:
            return None
        key, known = self.config.option("key"), self.config.option("known_hosts")
        return LoginHost(
            host=host,
            user=self.config.option("user") or getpass.getuser(),  # ssh's own default
            key=Path(key).expanduser() if key else None,
            port=int(self.config.option("port", 22)),
            known_hosts=Path(known).expanduser() if known else None,
            options=tuple(self.config.option("options", ())),
        )

    def login_host(self) -> LoginHost:
        """The login host; UsageError when the options name none. Pure."""
        login = self.login()
        if login is None:
            raise UsageError(
                "the Slurm provider needs the cluster's login host",
                hint="set providers.slurm.host (and user, key) in job.yaml or config.yaml",
            )
        return login

    @property
    def python(self) -> str:
        return str(self.config.option("python", "python3"))

    @property
    def compute(self) -> SlurmCompute:
        """The cluster's compute, through the login host. UsageError without one."""
        with self._lock:
            if self._compute is None:
                self._compute = SlurmCompute(
                    self.login_host(),
                    str(self.config.option("workdir", DEFAULT_WORKDIR)),
                    python=self.python,
                    # the option, else the partition the plan chose (its region)
                    partition=self.config.option("partition") or self.config.region,
                    account=self.config.option("account"),
                    qos=self.config.option("qos"),
                )
            return self._compute

    def store(self, uri: str) -> ObjectStore:
        """The bucket at a slurm:///PATH URI: through the login host on the controller, the
        folder itself on the cluster. At an s3://, gs:// or az:// URI (INFO.other_schemes):
        that cloud's store with its default config, the credentials found here (the nodes
        open it by the URI with the credentials found on the cluster). Creates nothing."""
        if not uri.startswith(f"{SCHEME}:"):
            return plain_store(uri)
        login = self.login()
        if login is None:
            return node_store(uri)
        return SlurmStore(uri, login, self.python)

    def workdir_path(self) -> str:
        """The workdir's absolute path on the cluster (made if missing). Blocks (one ssh,
        once)."""
        with self._lock:
            if self._workdir_path is None:
                workdir = str(self.config.option("workdir", DEFAULT_WORKDIR)).removeprefix("~/")
                out = run_on_login(
                    self.login_host(),
                    ["sh", "-c", 'mkdir -p -m 700 "$1" && cd "$1" && pwd -P', "sh", workdir],
                    what=f"mkdir {workdir}",
                )
                path = out.strip().splitlines()[-1] if out.strip() else ""
                if not path.startswith("/"):
                    raise UsageError(f"the cluster's workdir {workdir!r} has no absolute path")
                self._workdir_path = path
            return self._workdir_path

    def default_store_uri(self, run_id: str) -> str:
        """One bucket for the user's runs on this cluster: `<workdir>/bucket`. Blocks (one ssh,
        once)."""
        return uri_of(f"{self.workdir_path()}/{BUCKET_FOLDER}")
