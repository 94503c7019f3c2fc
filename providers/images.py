"""What a cloud image is, as cloudtrain needs to know it: `ImageInfo`.

Each cloud adapter has one `images.py` (aws, gcp, azure) with its `DEFAULT_IMAGES` (the images it
boots by default or by an `image:` alias, each an `ImageInfo`) and one function, `image_for`, that
picks the image for a machine: nothing else in an adapter chooses an image. The offline boot
harness maps the image an adapter chose back to an `ImageInfo` (by `ref`, plus
`driver_extension` on Azure) to know which Python the node has and whether a driver is there.

Where the driver comes from (`driver_by`):
- "image": the image ships the NVIDIA kernel driver (AWS Deep Learning AMIs, Azure Ubuntu-HPC);
- "first-boot": the image installs it at first boot (GCP Deep Learning VM images, asked for with
  the `install-nvidia-driver=True` metadata); the startup script waits for it;
- "extension": the cloud's VM extension installs it (Azure NvidiaGpuDriverLinux); the startup
  script waits for it;
- "bootstrap": nothing does; cloudtrain's startup script installs it on a GPU node
  (`jobs/startup.sh.j2`, branch R580).
Pure data, stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DriverBy = Literal["image", "first-boot", "extension", "bootstrap"]


@dataclass(frozen=True)
class ImageInfo:
    """One image: `ref` is what the adapter sends to the cloud (AWS: the public SSM parameter
    name, or an `ami-` id; GCP: the image or family path; Azure: the URN
    `publisher:offer:sku:version` or an image id). `os` and `python` (the OS's `python3`) are None
    for an image the user named and cloudtrain does not know. `families` are the machine
    families that get this image by default (empty: only when asked for by `key`)."""

    key: str  # cloudtrain's name for it (the `image:` alias), or "custom"
    ref: str
    os: str | None
    python: str | None
    driver_by: DriverBy
    families: tuple[str, ...] = ()
    source: str = ""

    @property
    def ships_driver(self) -> bool:
        """Whether the NVIDIA kernel driver is on the image itself."""
        return self.driver_by == "image"

    @property
    def driver_extension(self) -> bool:
        """Whether the adapter adds a driver extension to the VM (Azure NvidiaGpuDriverLinux)."""
        return self.driver_by == "extension"


def custom_image(ref: str) -> ImageInfo:
    """An image the user named by id or path: its OS and Python are unknown, and a GPU node's
    driver is installed by the bootstrap when the image has none. Pure."""
    return ImageInfo("custom", ref, None, None, "bootstrap")
