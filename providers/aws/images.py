"""The AMIs cloudtrain boots on EC2, and the one place that picks one: `image_for`.

Default images (`DEFAULT_IMAGES`), resolved to AMI ids through AWS's public SSM parameters:

- GPU nodes on G4dn, G5, G6, Gr6, G6e, P4d, P4de, P5, P5e, P5en: the Deep Learning Base OSS Nvidia
  Driver GPU AMI (Ubuntu 22.04): driver on the image, `/usr/bin/python3.10`. Source: the DLAMI
  release notes (docs.aws.amazon.com/dlami/latest/devguide, "Deep Learning Base OSS Nvidia Driver
  GPU AMI (Ubuntu 22.04)": supported_ec2_instances lists exactly those; python_location
  /usr/bin/python3.10).
- GPU nodes on P3 (V100): that AMI does not list P3: NVIDIA's open kernel modules, the "OSS"
  driver, need Turing or newer, and AWS's proprietary-driver DLAMIs exist for Amazon Linux 2 and
  Ubuntu 20.04 only, both past support. So P3 boots Canonical's Ubuntu 22.04 and the bootstrap
  installs `nvidia-driver-580-server`, the proprietary R580 driver, the last branch that drives
  Volta (jobs/startup.sh.j2).
- CPU nodes (parameter servers): Canonical's Ubuntu 22.04 (Python 3.10).

The SSM parameter of a DLAMI is its name minus "Deep", "Learning" and "AMI", lower-cased and
hyphenated (docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html):
"Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)" ->
`base-oss-nvidia-driver-gpu-ubuntu-22.04`. (That page's own example drops the "gpu"; the rule,
and public uses that print the AMI id it resolves to, keep it.) Canonical publishes Ubuntu's under
/aws/service/canonical/ubuntu/server/ (22.04 under ebs-gp2, 24.04 under ebs-gp3).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.aws.network import call
from cloudtrain.providers.images import ImageInfo, custom_image

if TYPE_CHECKING:
    from cloudtrain.providers.base import NodeRequest

_DLAMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-{}/latest/ami-id"
_CANONICAL = "/aws/service/canonical/ubuntu/server/{}/stable/current/amd64/hvm/{}/ami-id"
_DLAMI_SOURCE = "AWS DLAMI release notes: Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu {})"
# The OSS-driver DLAMI's supported_ec2_instances (release notes, 2026): Turing and newer.
OSS_DLAMI_FAMILIES = ("g4dn", "g5", "g6", "gr6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en")
# GPU families older than Turing, which the open kernel modules (and so that AMI) cannot drive.
PRE_TURING_FAMILIES = ("p3", "p3dn")

DLAMI_2204 = ImageInfo(
    "dlami-ubuntu-22.04",
    _DLAMI.format("22.04"),
    "Ubuntu 22.04",
    "3.10",
    "image",
    OSS_DLAMI_FAMILIES,
    _DLAMI_SOURCE.format("22.04"),
)
DLAMI_2404 = ImageInfo(
    "dlami-ubuntu-24.04",
    _DLAMI.format("24.04"),
    "Ubuntu 24.04",
    "3.12",
    "image",
    (),
    _DLAMI_SOURCE.format("24.04"),
)
UBUNTU_2204 = ImageInfo(
    "ubuntu-22.04",
    _CANONICAL.format("22.04", "ebs-gp2"),
    "Ubuntu 22.04",
    "3.10",
    "bootstrap",
    ("cpu", *PRE_TURING_FAMILIES),
    "Canonical: Ubuntu 22.04 LTS public SSM parameters",
)
UBUNTU_2404 = ImageInfo(
    "ubuntu-24.04",
    _CANONICAL.format("24.04", "ebs-gp3"),
    "Ubuntu 24.04",
    "3.12",
    "bootstrap",
    (),
    "Canonical: Ubuntu 24.04 LTS public SSM parameters",
)
DEFAULT_IMAGES: dict[str, ImageInfo] = {
    i.key: i for i in (DLAMI_2204, DLAMI_2404, UBUNTU_2204, UBUNTU_2404)
}
IMAGE_ALIASES: dict[str, ImageInfo] = {"dlami": DLAMI_2204, **DEFAULT_IMAGES}  # `image:` names

_AMIS: dict[tuple[str, str], str] = {}  # (region, SSM parameter) -> AMI id, for this process
_AMIS_LOCK = threading.Lock()


def family(instance_type: str) -> str:
    """The EC2 family of an instance type (`p3.2xlarge` -> `p3`). Pure."""
    return instance_type.split(".", 1)[0].lower()


def image_for(instance_type: str, gpu: bool, explicit: str | None = None) -> ImageInfo:
    """The image a node boots: `explicit` (an `ami-` id, or a name of IMAGE_ALIASES), else the
    default for the machine (see the module docstring): plain Ubuntu 22.04 for CPU nodes and
    pre-Turing GPUs, the OSS-driver DLAMI for every other GPU family. Raises ProviderError for
    an unknown name. Pure."""
    if explicit and explicit.startswith("ami-"):
        return custom_image(explicit)
    if explicit:
        if explicit not in IMAGE_ALIASES:
            raise ProviderError(
                f"unknown image {explicit!r} for AWS",
                hint=f"use an ami-... id or one of: {', '.join(IMAGE_ALIASES)}",
            )
        return IMAGE_ALIASES[explicit]
    if not gpu or family(instance_type) in PRE_TURING_FAMILIES:
        return UBUNTU_2204
    return DLAMI_2204


def node_image(request: NodeRequest) -> ImageInfo:
    """The image `request`'s node boots (`image_for` with the node's instance type, GPU and
    `image:`); INFO.node_image. Raises ProviderError as `image_for` does. Pure."""
    return image_for(request.instance_type, request.accelerator_count > 0, request.image)


def clear_image_cache() -> None:
    """Forget the AMI ids resolved so far (tests; a long-lived process after an AMI release)."""
    with _AMIS_LOCK:
        _AMIS.clear()


def resolve_ami(ssm: Any, region: str, image: ImageInfo) -> str:
    """The AMI id of `image` in `region`: an `ami-` ref as is, else the value of its public SSM
    parameter (one `ssm:GetParameter`, cached per process). Blocks once. Raises ProviderError
    naming the parameter when the region lacks it."""
    if image.ref.startswith("ami-"):
        return image.ref
    key = (region, image.ref)
    with _AMIS_LOCK:
        if key in _AMIS:
            return _AMIS[key]
    answer = call(
        f"resolve the image {image.key} ({image.ref})",
        lambda: ssm.get_parameter(Name=image.ref),
        ok={"ParameterNotFound"},
    )
    if answer is None:
        raise ProviderError(
            f"no SSM parameter {image.ref} in {region}: cannot pick an AMI",
            hint="set image: ami-... under cluster: in job.yaml",
        )
    ami = str(answer["Parameter"]["Value"])
    with _AMIS_LOCK:
        _AMIS[key] = ami
    return ami
