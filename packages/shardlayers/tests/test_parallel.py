"""Multi-process tests (gloo, torch spawn): layers, loss, state dicts, TP x DP training, DDP."""

from __future__ import annotations

import os
import sys

import pytest

from distkit_common.testing import run_spawn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scripts import training


@pytest.mark.spawn
def test_layers_on_1_2_4_ranks_and_tp2_dp2_training() -> None:
    """One set of 4 processes: every layer and dim (forward + all gradients), cross-entropy
    options, collect/relocate, convert, tags and bad input, against single-process references, at
    TP sizes 1, 2 and 4; then a TP=2 x DP=2 transformer block trained 20 steps == single process,
    reloaded at TP=4 / TP=1, DDP over the world with ignored shards, and a sharded checkpoint
    loaded after the world is re-initialised with permuted ranks."""
    run_spawn(training.body, 4, timeout=300)
