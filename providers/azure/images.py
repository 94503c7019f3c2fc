"""The images cloudtrain boots on Azure, and the one place that picks one: `image_for`.

Default images (`DEFAULT_IMAGES`; `ref` is the URN `publisher:offer:sku:version`):

- GPU nodes on NCasT4_v3 and NC A100 v4: Canonical's Ubuntu 22.04 (Gen2, Python 3.10) with the
  NvidiaGpuDriverLinux extension (Microsoft.HpcCompute 1.6), which installs the CUDA driver. Its
  support manifest, Azure/azhpc-extensions `NvidiaGPU/Nvidia-GPU-Linux-Resources.json` (version
  20241213), lists for CUDA the families NC, NCv2, NCv3, NCasT4_v3, NVv3 and NC_A100_v4 only,
  on Ubuntu 22.04 only; any other size fails the extension with exit code 13. Its driver is
  535.54: TensorFlow's CUDA 12 wheels run on it through CUDA's minor-version compatibility.
- GPU nodes on ND A100 v4, NC H100 v5 and ND H100 v5 (not in that manifest): Microsoft's
  Ubuntu-HPC 22.04 (`microsoft-dsvm:ubuntu-hpc:2204`, Python 3.10), which ships the driver (R580 in
  Azure/azhpc-images `versions.json`) and the fabric manager and InfiniBand stack the 8-GPU
  NVSwitch ND sizes need, and which the image's own SKU setup lists for both families
  (azhpc-images `components/setup_sku_customizations.sh`@1547be73: ndv4, ncv5, and ndv5 for
  `standard_nd96is*_h[1-2]00_v5`). A driver the bootstrap
  installed on plain Ubuntu would lack the fabric manager, so the image is the better choice.
- Other GPU sizes: plain Ubuntu 22.04; the bootstrap installs the R580 driver.
- CPU nodes: Canonical's Ubuntu 22.04 (Gen2).

NCv3 (V100) sizes were retired on 2025-09-30 (MicrosoftDocs/azure-docs,
`articles/virtual-machines/ncv3-nc6s-nc12s-nc24s-retirement.md`); they are out of the catalog
(`cloudtrain.catalog.retired`). Pure data and functions.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.images import ImageInfo, custom_image

if TYPE_CHECKING:
    from cloudtrain.providers.base import NodeRequest

_JAMMY = "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest"
_MANIFEST = "Azure/azhpc-extensions NvidiaGPU/Nvidia-GPU-Linux-Resources.json (CUDA, Ubuntu 22.04)"
# Size families by name (Azure's size docs), each with the regex of its size names.
FAMILIES: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern, re.IGNORECASE)
    for name, pattern in {
        "NCasT4_v3": r"^standard_nc\d+as_t4_v3$",
        "NC_A100_v4": r"^standard_nc\d+ads_a100_v4$",
        "NCv3": r"^standard_nc\d+r?s_v3$",
        "ND_A100_v4": r"^standard_nd\d+am?sr_(a100_)?v4$",
        "NC_H100_v5": r"^standard_nc\d+adi?s_h100_v5$",
        "ND_H100_v5": r"^standard_nd\d+isr_h100_v5$",
    }.items()
}
# The manifest's CUDA families that cloudtrain's catalog can hold (NC, NCv2, NVv3 are retired).
EXTENSION_FAMILIES = ("NCasT4_v3", "NC_A100_v4", "NCv3")
HPC_FAMILIES = ("ND_A100_v4", "NC_H100_v5", "ND_H100_v5")

UBUNTU_2204 = ImageInfo(
    "ubuntu-22.04", _JAMMY, "Ubuntu 22.04", "3.10", "bootstrap", ("cpu",), "Canonical Ubuntu 22.04"
)
UBUNTU_2204_NVIDIA = ImageInfo(  # the same image, with the extension
    "ubuntu-22.04-nvidia",
    _JAMMY,
    "Ubuntu 22.04",
    "3.10",
    "extension",
    EXTENSION_FAMILIES,
    _MANIFEST,
)
UBUNTU_2404 = ImageInfo(
    "ubuntu-24.04",
    "Canonical:ubuntu-24_04-lts:server:latest",
    "Ubuntu 24.04",
    "3.12",
    "bootstrap",
    (),
    "Canonical Ubuntu 24.04",
)
UBUNTU_HPC = ImageInfo(
    "ubuntu-hpc",
    "microsoft-dsvm:ubuntu-hpc:2204:latest",
    "Ubuntu 22.04",
    "3.10",
    "image",
    HPC_FAMILIES,
    "Azure/azhpc-images README and versions.json (Ubuntu-HPC 22.04)",
)
DEFAULT_IMAGES: dict[str, ImageInfo] = {
    i.key: i for i in (UBUNTU_2204, UBUNTU_2204_NVIDIA, UBUNTU_2404, UBUNTU_HPC)
}
IMAGE_ALIASES = DEFAULT_IMAGES  # `image:` names
_URN = re.compile(
    r"^(?P<publisher>[^:\s]+):(?P<offer>[^:\s]+):(?P<sku>[^:\s]+):(?P<version>[^:\s]+)$"
)


def family(vm_size: str) -> str | None:
    """The size family of `vm_size` (one of FAMILIES), or None. Pure."""
    return next((name for name, rx in FAMILIES.items() if rx.match(vm_size)), None)


def image_for(vm_size: str, gpu: bool, explicit: str | None = None) -> ImageInfo:
    """The image a node boots and whether it gets the driver extension (`.driver_extension`):
    `explicit` (a name of IMAGE_ALIASES, a URN, or an image id `/subscriptions/...`), else the
    default for the size (see the module docstring). The extension is never asked for a CPU
    node, nor for a size its manifest does not list: `ubuntu-22.04-nvidia` there is refused.
    Raises ProviderError for an unknown name. Pure."""
    if explicit is None:
        if not gpu:
            return UBUNTU_2204
        fam = family(vm_size)
        if fam in EXTENSION_FAMILIES:
            return UBUNTU_2204_NVIDIA
        return UBUNTU_HPC if fam in HPC_FAMILIES else UBUNTU_2204
    if explicit in IMAGE_ALIASES:
        image = IMAGE_ALIASES[explicit]
        if image.driver_extension and not gpu:
            return UBUNTU_2204
        if image.driver_extension and family(vm_size) not in EXTENSION_FAMILIES:
            raise ProviderError(
                f"image {explicit}: the NvidiaGpuDriverLinux extension does not support {vm_size}",
                hint="use image: ubuntu-hpc (driver on the image) or ubuntu-22.04",
            )
        return image
    if _URN.match(explicit) or explicit.startswith("/subscriptions/"):
        return custom_image(explicit)
    raise ProviderError(
        f"unknown image {explicit!r} for Azure",
        hint="use PUBLISHER:OFFER:SKU:VERSION, an image id /subscriptions/..., or one of: "
        + ", ".join(IMAGE_ALIASES),
    )


def node_image(request: NodeRequest) -> ImageInfo:
    """The image `request`'s node boots (`image_for` with the node's instance type, GPU and
    `image:`); INFO.node_image. Raises ProviderError as `image_for` does. Pure."""
    return image_for(request.instance_type, request.accelerator_count > 0, request.image)


def reference(image: ImageInfo) -> dict[str, str]:
    """The VM body's `imageReference` of `image`: publisher/offer/sku/version, or its id. Pure."""
    m = _URN.match(image.ref)
    return m.groupdict() if m else {"id": image.ref}
