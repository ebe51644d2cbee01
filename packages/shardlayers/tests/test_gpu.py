"""The real CUDA cross-entropy kernels (marked ``gpu``; skipped where no GPU is visible).

Each test runs in fresh processes (torch spawn): a kernel fault leaves the CUDA context unusable,
and it must not take the rest of the session with it.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from distkit_common.testing import run_spawn
from shardlayers import _shardlayers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scripts import gpu_xent

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and _shardlayers.cuda_compiled()),
        reason="no CUDA device, or shardlayers built without nvcc: the gpu tests run the real CUDA kernels",
    ),
]


def test_cuda_kernels_match_cpu_kernels() -> None:
    """stats + gradient kernels vs the CPU ones: every dtype, masked, fully masked and ignored rows."""
    run_spawn(gpu_xent.kernels_body, 1, timeout=300)


def test_cuda_vector_cuts_match_cpu_kernels() -> None:
    """16-byte vector cuts on the GPU: every start offset within 16 bytes, odd row strides, lengths
    around the vector width, a misaligned gradient buffer (nothing written outside it)."""
    run_spawn(gpu_xent.vectors_body, 1, timeout=300)


def test_cuda_vocab_parallel_head_two_ranks() -> None:
    """A padded vocab-parallel head on CUDA over 2 ranks (gloo, one GPU): loss and gradients equal
    F.cross_entropy on the unpadded logits, with ignored rows and a rank holding only padding rows."""
    run_spawn(gpu_xent.head_body, 2, timeout=300)
