"""The box's image facts (tests/fakes/box_images.py) and cloudtrain's image table
(providers/*/images.py) are written independently from the clouds' sources: they must agree,
and every default image an adapter can choose must be one the box can boot."""

from __future__ import annotations

import pytest

from cloudtrain.providers.aws import images as aws
from cloudtrain.providers.azure import images as azure
from cloudtrain.providers.gcp import images as gcp
from tests.fakes.box_images import FACTS, UnknownImage, base_python, facts

TABLES = {"aws": aws.DEFAULT_IMAGES, "gcp": gcp.DEFAULT_IMAGES, "azure": azure.DEFAULT_IMAGES}
CASES = [(cloud, key) for cloud, table in TABLES.items() for key in table]


@pytest.mark.parametrize(("cloud", "key"), CASES)
def test_every_default_image_is_one_the_box_boots_and_the_facts_agree(cloud: str, key: str) -> None:
    image = TABLES[cloud][key]
    box = facts(f"{cloud}:{image.ref}")
    assert box.os == (image.os or "").lower().replace(" ", "-")
    assert box.python == image.python
    assert box.driver == (image.driver_by in ("image", "first-boot"))


def test_the_box_knows_no_image_the_adapters_never_choose() -> None:
    refs = {f"{cloud}:{image.ref}" for cloud, table in TABLES.items() for image in table.values()}
    assert set(FACTS) == refs


def test_an_unknown_image_is_refused_not_booted_as_something_else() -> None:
    with pytest.raises(UnknownImage):
        facts("aws:ami-0123456789abcdef0")


@pytest.mark.parametrize("version", sorted({f.python for f in FACTS.values()}))
def test_every_python_the_images_ship_is_on_this_machine(version: str) -> None:
    assert base_python(version).name == f"python{version}"
