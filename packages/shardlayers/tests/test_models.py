"""A real model (Hugging Face LlamaForCausalLM, built from a config: no download) parallelized with
ts.llama_plan on 2 and 4 ranks, against the single-process model."""

from __future__ import annotations

import os
import sys

import pytest

from distkit_common.testing import run_spawn

pytest.importorskip("transformers", reason="transformers is a test-only requirement (noxfile TEST_REQUIREMENTS)")
pytest.importorskip("distx_fake", reason="distx-fake is shardlayers' optional extra (noxfile TEST_EXTRAS)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scripts import llama


@pytest.mark.spawn
@pytest.mark.slow
def test_llama_tp2_sp_deferred_dtensor_plan_errors_tp2_dp2_save_reload(tmp_path: object) -> None:
    """4 processes. TP=2, 10 steps each: eager weights; sequence parallel from deferred_init (no
    full weight built); the DTensor-style plan; bad plans raise before any change. Then TP=2 x
    DP=2 with DDP, 10 steps == one process; sharded checkpoints (distx-fake and DCP) load at TP=4,
    TP=1 and into a plain model in one process: same logits."""
    run_spawn(llama.body, 4, args=(str(tmp_path),), timeout=420)
