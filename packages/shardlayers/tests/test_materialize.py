"""Shards of parameters for parallelize_module: real tensors sliced, deferred_init ones built through
distx-fake's public materialize_shard (padded like real ones), its error surfaced as shardlayers'."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import shardlayers as ts
from shardlayers._materialize import full_of, is_deferred_tensor, shard_of

di = pytest.importorskip("distx_fake.deferred_init", reason="distx-fake is shardlayers' optional extra")


def test_deferred_shards_equal_the_eager_ones_padded() -> None:
    torch.manual_seed(5)
    eager = nn.Embedding(11, 6, padding_idx=2)
    torch.manual_seed(5)
    m = di.deferred_init(nn.Embedding, 11, 6, padding_idx=2)
    assert is_deferred_tensor(m.weight) and not is_deferred_tensor(eager.weight)
    for axis, start, length, rows in ((0, 0, 4, None), (0, 8, 3, 4), (1, 3, 3, 5)):
        got = shard_of(m.weight, axis, start, length, rows)
        want = shard_of(eager.weight, axis, start, length, rows)
        assert torch.equal(got, want), (axis, start, length, rows)
        if rows is not None:
            assert got.shape[axis] == rows and not got.narrow(axis, length, rows - length).any()
    assert di.is_deferred(m.weight)  # the shards ran none of its recorded ops
    assert torch.equal(full_of(m.weight), eager.weight.detach())


class _Exp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8, 4))
        with torch.no_grad():
            self.w.exp_()


def test_an_op_without_a_shard_replay_raises_shardlayers_error() -> None:
    m = di.deferred_init(_Exp)
    with pytest.raises(ts.ShardMaterializeError, match="exp_") as info:
        shard_of(m.w, 0, 0, 4)
    assert isinstance(info.value.__cause__, di.ShardMaterializeError)
