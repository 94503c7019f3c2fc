"""The boot images cloudtrain uses on Compute Engine, and the one place that picks one: `image_for`.

Default images (`DEFAULT_IMAGES`):

- GPU nodes (N1 with T4, V100, P100 or P4 attached; A2, A3, G2 with built-in A100, H100, L4):
  the Deep Learning VM family `common-cu129-ubuntu-2204-nvidia-580` (project
  deeplearning-platform-release): Ubuntu 22.04, Python 3.10, CUDA 12.9, and the R580 driver
  installed at first boot (the `install-nvidia-driver=True` metadata). Source: Google Cloud's
  Deep Learning VM "Choose an image" table (cloud.google.com/deep-learning-vm/docs/images):
  `common-cu128-ubuntu-2204-nvidia-570`, the former default, reached its end of patch and
  support on 2026-04-13; `common-cu129-ubuntu-{2204,2404}-nvidia-580` replace it, supported to
  2028-08. R580 still drives Pascal and Volta (P100, P4, V100), and the newer GPUs.
- CPU nodes: Canonical's Ubuntu 22.04 (Python 3.10).

K80s (Kepler) are end of life on GCP and no R580 driver drives them: `image_for` refuses them.
Pure data and functions; no SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.images import ImageInfo, custom_image

if TYPE_CHECKING:
    from cloudtrain.providers.base import NodeRequest

DLVM_PROJECT = "deeplearning-platform-release"
_DLVM = f"projects/{DLVM_PROJECT}/global/images/family/common-cu129-ubuntu-{{}}-nvidia-580"
_DLVM_SOURCE = "Deep Learning VM 'Choose an image': common-cu129-ubuntu-{}-nvidia-580"
# GPUs a Deep Learning VM serves: those GCE offers on N1, A2, A3 and G2 that R580 drives.
DLVM_GPUS = ("T4", "V100", "P100", "P4", "A100", "A100-80GB", "H100", "H100-MEGA", "L4")
UNSUPPORTED_GPUS = {"K80": "K80 GPUs are end of life on GCP and no R580 driver drives them"}

DLVM_2204 = ImageInfo(
    "dlvm-ubuntu-22.04",
    _DLVM.format("2204"),
    "Ubuntu 22.04",
    "3.10",
    "first-boot",
    DLVM_GPUS,
    _DLVM_SOURCE.format("2204"),
)
DLVM_2404 = ImageInfo(
    "dlvm-ubuntu-24.04",
    _DLVM.format("2404"),
    "Ubuntu 24.04",
    "3.12",
    "first-boot",
    (),
    _DLVM_SOURCE.format("2404"),
)
UBUNTU_2204 = ImageInfo(
    "ubuntu-22.04",
    "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts",
    "Ubuntu 22.04",
    "3.10",
    "bootstrap",
    ("cpu",),
    "GCE public images: ubuntu-os-cloud ubuntu-2204-lts",
)
UBUNTU_2404 = ImageInfo(
    "ubuntu-24.04",
    "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64",
    "Ubuntu 24.04",
    "3.12",
    "bootstrap",
    (),
    "GCE public images: ubuntu-os-cloud ubuntu-2404-lts-amd64",
)
DEBIAN_12 = ImageInfo(
    "debian-12",
    "projects/debian-cloud/global/images/family/debian-12",
    "Debian 12",
    "3.11",
    "bootstrap",
    (),
    "GCE public images: debian-cloud debian-12",
)
DEFAULT_IMAGES: dict[str, ImageInfo] = {
    i.key: i for i in (DLVM_2204, DLVM_2404, UBUNTU_2204, UBUNTU_2404, DEBIAN_12)
}
IMAGE_ALIASES: dict[str, ImageInfo] = {"dlvm": DLVM_2204, **DEFAULT_IMAGES}  # `image:` names


def image_for(accelerator: str | None, gpu: bool, explicit: str | None = None) -> ImageInfo:
    """The image a node boots: `explicit` (a name of IMAGE_ALIASES, or a `projects/...` or https
    image path as is), else the Deep Learning VM for a GPU node and Ubuntu 22.04 for a CPU node.
    `accelerator` is the node's GPU model (attached or built in). Raises ProviderError for an
    unknown name or a GPU no image drives. Pure."""
    if accelerator and accelerator.upper() in UNSUPPORTED_GPUS:
        raise ProviderError(
            f"{accelerator}: {UNSUPPORTED_GPUS[accelerator.upper()]}",
            hint="ask for a T4, V100, A100, L4 or H100",
        )
    if explicit is None:
        return DLVM_2204 if gpu else UBUNTU_2204
    if explicit in IMAGE_ALIASES:
        return IMAGE_ALIASES[explicit]
    if explicit.startswith(("projects/", "https://")) and "/global/images/" in explicit:
        known = [i for i in DEFAULT_IMAGES.values() if explicit.endswith(i.ref)]
        if known:
            return known[0]
        first_boot = f"/{DLVM_PROJECT}/" in explicit  # any DLVM image installs at first boot
        image = custom_image(explicit)
        return ImageInfo(image.key, explicit, None, None, "first-boot") if first_boot else image
    raise ProviderError(
        f"unknown image {explicit!r} for GCP",
        hint="use projects/PROJECT/global/images/[family/]NAME or one of: "
        + ", ".join(IMAGE_ALIASES),
    )


def node_image(request: NodeRequest) -> ImageInfo:
    """The image `request`'s node boots (`image_for` with the node's accelerator, GPU and
    `image:`); INFO.node_image. Raises ProviderError as `image_for` does. Pure."""
    return image_for(request.accelerator, request.accelerator_count > 0, request.image)
