"""Shared fixtures of the wholemem tests."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wholemem as wg


@pytest.fixture
def comm() -> Iterator[wg.WholeMemoryCommunicator]:
    """A one-rank communicator in the test process."""
    wg.init_lib()
    c = wg.create_communicator(1, wg.get_unique_id(), 0)
    yield c
    wg.finalize_lib()


def load_gpu_fake() -> Any:
    """The host-memory stand-in for the CUDA backend (tests/scripts/gpu_fake.py)."""
    path = Path(__file__).parent / "scripts" / "gpu_fake.py"
    spec = importlib.util.spec_from_file_location("wholemem_gpu_fake", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def make_fake_gpu() -> Iterator[Any]:
    """``make(**options)`` routes wholemem's GPU paths through host memory (a
    ``FakeGpuBackend(**options)``) until the end of the test."""
    from wholemem import _gpu

    old = _gpu.backend()

    def make(**options: Any) -> Any:
        backend = load_gpu_fake().FakeGpuBackend(**options)
        _gpu.set_backend(backend)
        return backend

    try:
        yield make
    finally:
        _gpu.set_backend(old)


@pytest.fixture
def fake_gpu(make_fake_gpu: Any) -> Any:
    """Route wholemem's GPU paths through host memory for the duration of a test."""
    return make_fake_gpu()
