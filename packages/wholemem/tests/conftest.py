"""Shared fixtures of the wholemem tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import wholemem as wg


@pytest.fixture
def comm() -> Iterator[wg.Communicator]:
    """A one-rank communicator in the test process."""
    wg.init_lib()
    c = wg.create_communicator(1, wg.get_unique_id(), 0)
    yield c
    wg.finalize_lib()
