"""The Azurite kit's sharing: every test module imports its own session fixture (pytest keys a
fixture by the module defining it), so the kit itself must give them one process, and end it
with its last user, not leave one per module running until the session ends."""

from __future__ import annotations

import pytest

from tests.fakes import azurite as kit

pytestmark = pytest.mark.skipif(not kit.azurite_available(), reason="Azurite is not installed")


def test_nested_users_share_one_process_that_ends_with_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kit, "_SHARED", {})  # no user yet (the session's own is set aside)
    with kit.shared_azurite() as first:
        with kit.shared_azurite() as second:
            assert second is first and second.process is not None
            process = second.process
        assert process.poll() is None, "still in use by the first user"
        assert first.healthy()
    assert process.poll() is not None, "the last user left: the process ended"
    with kit.shared_azurite() as again:  # a later user gets a fresh one
        assert again is not first and again.healthy()
    assert kit._SHARED == {}
