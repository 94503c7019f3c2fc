"""Render `jobs/startup.sh.j2` (with `jobs/wheelhouse.sh.j2`), the one bootstrap script every node
runs, for one node.

Pure: no I/O besides reading the template. Values are shell-quoted by the `q` filter, so nothing in
a spec can inject shell. Secrets never go in: the script carries only URLs that expire and names.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from cloudtrain.providers.base import StartupBlocks

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TF_VERSION = "2.21.0"
TF_KERAS_VERSION = "2.21.0"


@dataclass(frozen=True)
class BuiltStack:
    """A node stack of its own for the strategies whose module (`image_module`) the pinned stack
    cannot have: the TensorFlow it installs instead of TF_VERSION, and the package the node
    builds from source against it when the image lacks the module (once per stack: the built
    wheel goes into the bucket's wheelhouse, cloudtrain/run/wheelhouse.py). Pure data."""

    module: str  # the module it provides (a strategy's image_module)
    tf_version: str  # the TensorFlow it installs (tensorflow==, tensorflow[and-cuda]== on GPUs)
    tf_keras_version: str  # "": no tf-keras
    build: str  # the requirement built from source (pip wheel --no-build-isolation)
    build_env: tuple[tuple[str, str], ...]  # the build's environment
    pythons: tuple[str, ...]  # the Pythons (X.Y) its TensorFlow has wheels for


# strategy horovod's legacy stack (issue 32). horovod 0.28.1 is Horovod's last release
# (pypi.org/project/horovod/#history, May 2023), which does not build against TensorFlow >= 2.16
# (issue 32; not re-tried here); 2.15.1 is the last TensorFlow before that, with wheels for
# CPython 3.9, 3.10 and 3.11 only
# (pypi.org/project/tensorflow/2.15.1/#files). Its own Keras is Keras 2 (its METADATA:
# keras<2.16,>=2.15.0), but 2.15 already honours TF_USE_LEGACY_KERAS=1, which cloudtrain's
# runtime sets (jobs/runtime.py): tf.keras then imports tf_keras, or fails ("Keras cannot be
# imported", seen here), so the stack pins tf-keras 2.15.1 (requires tensorflow<2.16,>=2.15).
# Horovod is built with Gloo (no MPI, no NCCL: its collectives run on the CPU, GPU nodes
# included), for TensorFlow only (horovod's docs, "Installation Guide": HOROVOD_WITH_*).
# Measured here: the build takes ~3 min on 2 cores (a 16 MB wheel, cp310 linux_x86_64).
HOROVOD_STACK = BuiltStack(
    module="horovod.tensorflow",
    tf_version="2.15.1",
    tf_keras_version="2.15.1",
    build="horovod==0.28.1",
    build_env=(
        ("HOROVOD_WITH_TENSORFLOW", "1"),
        ("HOROVOD_WITH_GLOO", "1"),
        ("HOROVOD_WITHOUT_MPI", "1"),
        ("HOROVOD_WITHOUT_PYTORCH", "1"),
        ("HOROVOD_WITHOUT_MXNET", "1"),
    ),
    pythons=("3.9", "3.10", "3.11"),
)
BUILT_STACKS: dict[str, BuiltStack] = {HOROVOD_STACK.module: HOROVOD_STACK}


def built_stack(module: str) -> BuiltStack | None:
    """The stack of its own that provides `module` (a strategy's image_module), or None: the
    node installs the pinned TF_VERSION stack. Pure."""
    return BUILT_STACKS.get(module)


# The NVIDIA driver branch the script installs where no driver works (Ubuntu's
# nvidia-driver-580-server, NVIDIA's cuda-drivers-580 on Debian 12); why 580: the template says.
NVIDIA_BRANCH = "580"
# The oldest Python a node runs on: the images' (Ubuntu 22.04: 3.10). pyproject's requires-python
# says the same, so pip refuses the wheel on anything older; the script says so first, clearly.
NODE_MIN_PYTHON = (3, 10)


@dataclass(frozen=True)
class WheelhouseOffer:
    """What the controller offers a node's python phase (cloudtrain/run/wheelhouse.py): "warm" (the
    presigned GET `url` of the tag's wheels.tar and its `sha256`, from the manifest) or "cold"
    (build the wheelhouse and publish it: presigned PUT URLs of the tar and the manifest). The
    script uses it only when `tag` is its own platform's; an empty mode offers nothing."""

    mode: str = ""  # "warm", "cold" or ""
    tag: str = ""  # py<X.Y>-<uname -m>-<pins hash>
    url: str = ""
    sha256: str = ""
    put_url: str = ""
    manifest_put_url: str = ""


@dataclass(frozen=True)
class StartupParams:
    """Everything one node's script needs."""

    run_id: str
    role: str
    index: int
    node_name: str
    store_uri: str
    bundle_url: str
    bundle_sha256: str
    log_put_url: str
    version: str
    deadline_epoch: int
    gpu_count: int = 0
    pip_extra: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    # the strategy's image module (jobs/strategies.py: image_module): the bootstrap fails unless
    # `import <it>` works, naming the strategy and saying the hint; "": none
    require_module: str = ""
    require_for: str = ""  # the strategy that needs it
    require_hint: str = ""
    # the wheelhouse of the pinned stack (bare images only), or None: install from the index
    wheelhouse: WheelhouseOffer | None = None


def quote(value: object) -> str:
    """Single-quote for bash, always (a bare word like `ps` reads as a command to shellcheck)."""
    return "'" + str(value).replace("'", "'\"'\"'") + "'"


@lru_cache(maxsize=1)
def _template():  # type: ignore[no-untyped-def]
    import jinja2

    def load(name: str) -> str:  # the templates are package data of cloudtrain.jobs
        return resources.files("cloudtrain.jobs").joinpath(name).read_text()

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = quote
    env.filters["oneline"] = lambda v: " ".join(str(v).split())
    # startup.sh.j2 includes wheelhouse.sh.j2 (the python phase's wheelhouse functions)
    return env.get_template("startup.sh.j2")


def render_startup(params: StartupParams, blocks: StartupBlocks) -> str:
    """The bash script for one node. Deterministic for the same inputs. Raises ValueError for
    an environment variable name that is not a shell identifier."""
    env = {**dict(blocks.env), **dict(params.env)}
    bad = [key for key in env if not _ENV_KEY.match(key)]
    if bad:
        raise ValueError(f"invalid environment variable name(s): {', '.join(map(repr, bad))}")
    stack = built_stack(params.require_module)
    values = {
        **dataclasses.asdict(params),
        **dataclasses.asdict(blocks),
        "tf_version": stack.tf_version if stack else TF_VERSION,
        "tf_keras_version": stack.tf_keras_version if stack else TF_KERAS_VERSION,
        "stack_build": stack.build if stack else "",
        "stack_build_env": " ".join(f"{k}={v}" for k, v in stack.build_env) if stack else "",
        "stack_pythons": " ".join(stack.pythons) if stack else "",
        "nvidia_branch": NVIDIA_BRANCH,
        "min_python": ".".join(map(str, NODE_MIN_PYTHON)),
        "power_off": blocks.power_off or ":",
        "env": env,
        "wheelhouse": dataclasses.asdict(params.wheelhouse or WheelhouseOffer()),
    }
    return str(_template().render(**values))
