"""Multi-process tests (gloo, torch spawn): layers, loss, state dicts, TP x DP training, DDP."""

from __future__ import annotations

import os
import sys

import pytest

from distkit_common.testing import run_spawn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scripts import layers, training


@pytest.mark.spawn
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_layers_loss_state_dict_errors(nprocs: int) -> None:
    """Every layer and dim (forward + all gradients), cross-entropy options, collect/relocate,
    convert, tags and bad input, against single-process references, on 1, 2 and 4 ranks."""
    run_spawn(layers.body, nprocs, timeout=150)


@pytest.mark.spawn
def test_transformer_tp2_dp2_training_and_reload() -> None:
    """TP=2 x DP=2 transformer block trained 20 steps == single process; reload at TP=4 / TP=1; DDP."""
    run_spawn(training.body, 4, timeout=170)
