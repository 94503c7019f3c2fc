"""The catalog and the images agree: every bundled catalog row boots an image that supports it.

The support facts below are transcribed from the clouds' own sources, independently of the
adapters' `images.py` (which state the same facts as the rules they act on):

- AWS: the DLAMI release notes, "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)",
  supported_ec2_instances: G4dn, G5, G6, Gr6, G6e, P4d, P4de, P5, P5e, P5en (no P3).
- GCP: the Deep Learning VM "Choose an image" table: common-cu128-ubuntu-2204-nvidia-570 is past
  its end of support (2026-04-13); common-cu129-ubuntu-{2204,2404}-nvidia-580 are supported to
  2028-08.
- Azure: Azure/azhpc-extensions NvidiaGPU/Nvidia-GPU-Linux-Resources.json (CUDA, Ubuntu 22.04):
  NC, NCv2, NCv3, NCasT4_v3, NVv3, NC_A100_v4; Azure/azhpc-images (Ubuntu-HPC 22.04, driver
  R580) sets up ND A100 v4 and NC H100 v5; NCv3 retired 2025-09-30 (MicrosoftDocs/azure-docs
  ncv3-nc6s-nc12s-nc24s-retirement.md).
- A driver the bootstrap installs is NVIDIA's proprietary R580 (`nvidia-driver-580-server`),
  which drives Maxwell to Hopper, Volta included (NVIDIA R580 release notes).

Plus the wiring: what the adapters really send for those rows (AWS: the SSM parameter, against
a moto seed written from AWS's naming rule; GCP: the insert body; Azure: the VM and extension
requests the ARM fake receives).
"""

from __future__ import annotations

import re

import pytest

from cloudtrain.catalog.build import build_rows
from cloudtrain.catalog.offers import Offer
from cloudtrain.catalog.pricing.common import bundled_offers, merge
from cloudtrain.catalog.retired import is_retired
from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.aws import images as aws_images
from cloudtrain.providers.azure import images as azure_images
from cloudtrain.providers.azure.compute import AzureCompute
from cloudtrain.providers.base import NodeRequest
from cloudtrain.providers.gcp import images as gcp_images
from cloudtrain.providers.gcp.bodies import instance_body
from cloudtrain.providers.gcp.tpu_types import tpu_type
from cloudtrain.providers.images import ImageInfo
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azurite, azurite_session
from tests.fakes.moto_server import (
    PUBLIC_IMAGE_PARAMS,
    moto_public_images,
    moto_server,
    moto_server_session,
)
from tests.unit.providers.azure.test_azure_compute import compute
from tests.unit.providers.azure.test_azure_compute import run_info as azure_run_info

__all__ = [  # fixtures, for pytest
    "azure_cloud",
    "azurite",
    "azurite_session",
    "compute",
    "moto_public_images",
    "moto_server",
    "moto_server_session",
]

CATALOG_DATE = "2026-11-21"  # the bundled prices' date: the images must be supported then
PYTHON_OF_OS = {"Ubuntu 22.04": "3.10", "Ubuntu 24.04": "3.12", "Debian 12": "3.11"}

# -- the sources, transcribed ------------------------------------------------------------------

AWS_OSS_DLAMI_2204 = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)
AWS_OSS_DLAMI_INSTANCES = {"g4dn", "g5", "g6", "gr6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en"}
R580_PROPRIETARY_GPUS = {
    "M60",
    "P4",
    "P100",
    "V100",
    "T4",
    "A10G",
    "L4",
    "A100",
    "A100-80GB",
    "H100",
}
# Deep Learning VM families: end of support (YYYY-MM), and which GPUs they serve on GCE.
GCP_DLVM_SUPPORT = {
    "common-cu128-ubuntu-2204-nvidia-570": "2026-04",
    "common-cu129-ubuntu-2204-nvidia-580": "2028-08",
    "common-cu129-ubuntu-2404-nvidia-580": "2028-08",
}
GCP_DLVM_GPUS = {"T4", "V100", "P100", "P4", "A100", "A100-80GB", "H100", "L4"}
# NvidiaGpuDriverLinux's manifest: CUDA families, as the size names of Azure's size docs.
AZURE_EXTENSION_SIZES = {
    "NC series": r"standard_nc\d+r?$",
    "NCv2 series": r"standard_nc\d+r?s_v2$",
    "NCv3 series": r"standard_nc\d+r?s_v3$",
    "NCasT4_v3 sizes": r"standard_nc\d+as_t4_v3$",
    "NVv3 Series": r"standard_nv\d+s_v3$",
    "NC_A100_v4 series": r"standard_nc\d+ads_a100_v4$",
}
# azhpc-images components/setup_sku_customizations.sh@1547be73: ndv4, ncv5, and ndv5
# (`standard_nd96is*_h[1-2]00_v5`)
AZURE_HPC_IMAGE_SIZES = {
    "ND A100 v4": r"standard_nd\d+\w*v4$",
    "NC H100 v5": r"standard_nc\d+adi?s_h100_v5$",
    "ND H100 v5": r"standard_nd96is\w*_h[12]00_v5$",
}
AZURE_HPC_URN = "microsoft-dsvm:ubuntu-hpc:2204:latest"
RETIRED_SIZES = {"azure": r"standard_nc\d+r?s_v3$"}  # NCv3, 2025-09-30


def _matches(patterns: dict[str, str], size: str) -> bool:
    return any(re.fullmatch(p, size.lower()) for p in patterns.values())


def _machine(offer: Offer) -> str:
    """The machine a row describes (a GCP GPU-only row is attached to an n1-standard-8)."""
    return offer.instance_type or "n1-standard-8"


def why_unsupported(offer: Offer, image: ImageInfo) -> str:
    """'' when `image` supports the machine of `offer` per the sources above, else why not."""
    gpu = offer.accelerator_count > 0
    if gpu and image.driver_by == "bootstrap" and offer.accelerator not in R580_PROPRIETARY_GPUS:
        return f"the bootstrap's R580 driver does not drive {offer.accelerator}"
    if offer.provider == "aws":
        if image.ref == AWS_OSS_DLAMI_2204:
            family = offer.instance_type.split(".")[0]
            if family not in AWS_OSS_DLAMI_INSTANCES:
                return f"the OSS-driver DLAMI does not list {family}"
        elif image.ref not in PUBLIC_IMAGE_PARAMS:
            return f"{image.ref} is no public image parameter"
    if offer.provider == "gcp" and "/deeplearning-platform-release/" in image.ref:
        name = image.ref.rsplit("/", 1)[-1]
        if GCP_DLVM_SUPPORT.get(name, "0000") < CATALOG_DATE[:7]:
            return f"the Deep Learning VM family {name} is past its end of support"
        if offer.accelerator not in GCP_DLVM_GPUS:
            return f"the Deep Learning VM does not serve {offer.accelerator}"
    if offer.provider == "azure" and gpu:
        if image.driver_extension and not _matches(AZURE_EXTENSION_SIZES, offer.instance_type):
            return f"NvidiaGpuDriverLinux's manifest does not list {offer.instance_type}"
        if image.ref == AZURE_HPC_URN and not _matches(AZURE_HPC_IMAGE_SIZES, offer.instance_type):
            return f"Ubuntu-HPC is not set up for {offer.instance_type}"
    return ""


def chosen(offer: Offer) -> ImageInfo:
    """The image the offer's adapter picks by default."""
    gpu = offer.accelerator_count > 0
    if offer.provider == "aws":
        return aws_images.image_for(offer.instance_type, gpu)
    if offer.provider == "gcp":
        return gcp_images.image_for(offer.accelerator, gpu)
    return azure_images.image_for(offer.instance_type, gpu)


# the machines of every cloud; a GCP TPU offer's image is its TPU runtime, not a VM image
# (tests/unit/catalog/test_catalog_tpu.py checks that every TPU row has one)
ROWS = [
    o
    for p in ("aws", "gcp", "azure")
    for o in bundled_offers(p)
    if not (p == "gcp" and tpu_type(o.instance_type))
]


@pytest.mark.parametrize(
    "offer", ROWS, ids=[f"{o.provider}-{_machine(o)}-{o.accelerator}-{o.region}" for o in ROWS]
)
def test_every_catalog_row_boots_an_image_that_supports_it(offer: Offer) -> None:
    image = chosen(offer)
    assert why_unsupported(offer, image) == "", f"{_machine(offer)} gets {image.key}"
    if offer.accelerator_count > 0:
        assert image.driver_by != "bootstrap" or offer.provider != "gcp", "GCP GPUs get a DLVM"


def test_the_oracle_catches_the_old_choices() -> None:
    """The checks above fail on the images cloudtrain used to boot."""
    p3 = next(o for o in ROWS if o.instance_type == "p3.2xlarge")
    old_dlami = aws_images.DLAMI_2204  # the OSS DLAMI for every GPU
    assert "does not list p3" in why_unsupported(p3, old_dlami)
    a100 = next(o for o in ROWS if o.provider == "gcp" and o.accelerator == "A100")
    old_dlvm = ImageInfo(
        "dlvm",
        "projects/deeplearning-platform-release/global/images/family/"
        "common-cu128-ubuntu-2204-nvidia-570",
        "Ubuntu 22.04",
        "3.10",
        "first-boot",
    )
    assert "past its end of support" in why_unsupported(a100, old_dlvm)
    nd = next(o for o in ROWS if o.instance_type == "Standard_ND96asr_v4")
    assert "does not list" in why_unsupported(nd, azure_images.UBUNTU_2204_NVIDIA)


def test_no_retired_machine_in_any_bundled_catalog() -> None:
    for offer in ROWS:
        pattern = RETIRED_SIZES.get(offer.provider)
        assert not (pattern and re.fullmatch(pattern, offer.instance_type.lower())), offer
    assert is_retired("azure", "Standard_NC6s_v3") and is_retired("azure", "Standard_NC24rs_v3")
    assert not is_retired("azure", "Standard_NC4as_T4_v3")


def _source_row(instance_type: str) -> dict[str, str]:
    return {
        "provider": "azure",
        "instance_type": instance_type,
        "accelerator": "V100",
        "accelerator_count": "1",
        "vcpus": "6",
        "memory_gib": "112",
        "region": "eastus",
        "zone": "",
        "price_hourly_usd": "3.06",
        "spot_price_hourly_usd": "0.3978",
        "source": "test",
    }


def test_the_build_and_the_refresh_keep_retired_machines_out() -> None:
    ncv3 = RETIRED_SIZES["azure"]
    built = build_rows([_source_row("Standard_NC6s_v3"), _source_row("Standard_NC4as_T4_v3")])
    kept = [r["instance_type"] for r in built["azure"]]
    assert "Standard_NC4as_T4_v3" in kept
    assert not [t for t in kept if re.fullmatch(ncv3, t.lower())]
    bundled = bundled_offers("azure")  # `catalog refresh` merges the API's rows with these
    date = CATALOG_DATE
    old = Offer("azure", "Standard_NC6s_v3", "V100", 1, 6.0, 112.0, "eastus", None, 3.1, None, date)
    new = Offer("azure", "Standard_NC24s_v3", "V100", 4, 24.0, 448.0, "eastus", None, 12.2, 1, date)
    merged = merge([new], [*bundled, old])
    assert not [o for o in merged if re.fullmatch(ncv3, o.instance_type.lower())]
    assert len(merged) == len(bundled)


def test_default_images_describe_themselves() -> None:
    for module in (aws_images, gcp_images, azure_images):
        for key, image in module.DEFAULT_IMAGES.items():
            assert key == image.key and image.source, image
            assert image.os is not None and image.python == PYTHON_OF_OS[image.os], image
    assert aws_images.DLAMI_2204.ships_driver and azure_images.UBUNTU_HPC.ships_driver
    assert azure_images.UBUNTU_2204_NVIDIA.driver_extension
    assert not azure_images.UBUNTU_2204.driver_extension
    assert gcp_images.DLVM_2204.driver_by == "first-boot"


def test_explicit_images_and_bad_names() -> None:
    assert azure_images.image_for("Standard_D4s_v5", False, "ubuntu-22.04-nvidia").key == (
        "ubuntu-22.04"
    )
    with pytest.raises(ProviderError, match="does not support Standard_ND96asr_v4"):
        azure_images.image_for("Standard_ND96asr_v4", True, "ubuntu-22.04-nvidia")
    assert azure_images.image_for("Standard_ND96asr_v4", True, "ubuntu-22.04").key == "ubuntu-22.04"
    assert aws_images.image_for("p3.2xlarge", True, "dlami").key == "dlami-ubuntu-22.04"
    assert aws_images.image_for("g5.xlarge", True, "ami-0abc").ref == "ami-0abc"
    with pytest.raises(ProviderError, match="unknown image"):
        aws_images.image_for("g5.xlarge", True, "centos")
    with pytest.raises(ProviderError, match="K80"):
        gcp_images.image_for("K80", True)
    family = gcp_images.DLVM_2204.ref
    assert gcp_images.image_for("T4", True, family) == gcp_images.DLVM_2204
    other = "projects/deeplearning-platform-release/global/images/tf-2-21-cu129"
    assert gcp_images.image_for("T4", True, other).driver_by == "first-boot"


# -- what the adapters send for the catalog's rows ----------------------------------------------


def _request(offer: Offer, index: int = 0, run_id: str = "imgs-abc123") -> NodeRequest:
    return NodeRequest(
        run_id,
        "worker",
        index,
        _machine(offer),
        "#!/bin/bash\n",
        accelerator=offer.accelerator,
        accelerator_count=offer.accelerator_count,
    )


def test_every_ssm_parameter_the_aws_adapter_sends_exists_on_aws(
    moto_public_images: dict[str, str],
) -> None:
    from cloudtrain.providers.aws.compute import AwsCompute

    aws_images.clear_image_cache()
    compute = AwsCompute("us-east-1")
    for offer in {o.instance_type: o for o in ROWS if o.provider == "aws"}.values():
        image = aws_images.image_for(offer.instance_type, offer.accelerator_count > 0)
        assert compute.resolve_image(_request(offer)) == moto_public_images[image.ref]
    for image in aws_images.DEFAULT_IMAGES.values():  # the aliases too
        assert image.ref in PUBLIC_IMAGE_PARAMS
    aws_images.clear_image_cache()


def test_the_gcp_insert_body_boots_the_chosen_image() -> None:
    for offer in [o for o in ROWS if o.provider == "gcp"]:
        body = instance_body(_request(offer), "p", "us-central1-a", "global/networks/n", "t", None)
        source = body["disks"][0]["initializeParams"]["sourceImage"]
        metadata = {i["key"] for i in body["metadata"]["items"]}
        assert source == chosen(offer).ref
        gpu = offer.accelerator_count > 0
        assert ("install-nvidia-driver" in metadata) == gpu, offer
        assert source.endswith("common-cu129-ubuntu-2204-nvidia-580") == gpu, offer


def test_the_azure_vms_get_the_image_and_extension_their_size_supports(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    run = azure_run_info()
    compute.ensure_network(run)
    sizes = {o.instance_type: o for o in ROWS if o.provider == "azure"}
    requests = [_request(o, i, run.run_id) for i, o in enumerate(sizes.values())]
    compute.create_nodes(run, requests)
    extended = {  # the VMs an extension was added to, from its id .../virtualMachines/VM/...
        str(e["id"]).split("/virtualMachines/")[1].split("/")[0]
        for e in azure_cloud.arm.resources(kind="extensions")
    }
    assert extended, "no extension at all"
    for vm in azure_cloud.arm.resources(kind="virtualMachines"):
        size = vm["properties"]["hardwareProfile"]["vmSize"]
        ref = vm["properties"]["storageProfile"]["imageReference"]
        urn = ":".join(ref[k] for k in ("publisher", "offer", "sku", "version"))
        image = ImageInfo(
            "sent", urn, None, None, "extension" if vm["name"] in extended else "image"
        )
        offer = sizes[size]
        if offer.accelerator_count == 0:
            assert vm["name"] not in extended, size
            continue
        if vm["name"] not in extended:
            assert urn == AZURE_HPC_URN, f"{size}: no driver extension and no driver on {urn}"
        assert why_unsupported(offer, image) == "", size
