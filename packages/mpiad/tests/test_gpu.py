"""mpiad on CUDA tensors (marked ``gpu``; ``nox -s gpu``): the staging path, with autograd.

Each test runs its ranks in processes of their own (a CUDA fault is sticky for
the process that hits it). Two ranks share the GPU when there is only one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distkit_common.testing import run_mpi

SCRIPTS = Path(__file__).parent / "scripts"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.mpi,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch (the gpu suite needs one)"),
]


@pytest.mark.parametrize("mode", ["collectives", "p2p", "data_parallel"])
def test_cuda_tensors_match_cpu_values_and_gradients(mode: str) -> None:
    res = run_mpi(SCRIPTS / "cuda_paths.py", 2, args=[mode], timeout=300)
    assert f"cuda {mode}: all checks passed on 2 ranks" in res.stdout
