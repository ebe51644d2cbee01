"""Spawned body (4 ranks): the layer checks of scripts/layers.py at TP sizes 1, 2 and 4, then a
transformer block in TP=2 x DP=2 trained 20 steps with DDP over the data-parallel group matches
single-process training; its state dict reloads at TP=4 and TP=1; DDP over the world with
register_ddp_parameters_to_ignore, with the list convert_parallel_linear registers at TP = world,
and refused where it would average the shards of one tensor-parallel group; a sharded checkpoint
loaded after the world is re-initialised with permuted ranks."""

from __future__ import annotations

import io
import os
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import shardlayers as ts
import shardlayers._sharded
from distkit_common.testing import destroy_process_group, init_process_group

try:
    from scripts import layers
    from scripts.common import close, shard
except ImportError:  # loaded by file path
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from scripts import layers
    from scripts.common import close, shard

VOCAB, HIDDEN, HEADS, SEQ = 32, 16, 4, 6


class Block(nn.Module):
    def __init__(self, tp: bool) -> None:
        super().__init__()
        col, row = (-1, 0) if tp else (None, None)
        self.tp = tp
        self.emb = ts.nn.ParallelEmbedding(VOCAB, HIDDEN, dim=0 if tp else None)
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.q = ts.nn.ParallelLinear(HIDDEN, HIDDEN, dim=col)
        self.k = ts.nn.ParallelLinear(HIDDEN, HIDDEN, dim=col)
        self.v = ts.nn.ParallelLinear(HIDDEN, HIDDEN, dim=col)
        self.o = ts.nn.ParallelLinear(HIDDEN, HIDDEN, dim=row)
        self.ln2 = nn.LayerNorm(HIDDEN)
        self.fc1 = ts.nn.ParallelLinear(HIDDEN, 4 * HIDDEN, dim=col)
        self.fc2 = ts.nn.ParallelLinear(4 * HIDDEN, HIDDEN, dim=row)
        self.head = ts.nn.ParallelLinear(HIDDEN, VOCAB, dim=col)
        self.heads = HEADS // ts.distributed.get_group_size() if tp else HEADS

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        h = self.ln1(x)
        b, s, _ = h.shape
        q, k, v = (m(h).reshape(b, s, self.heads, -1).transpose(1, 2) for m in (self.q, self.k, self.v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        ctx = att.transpose(1, 2).reshape(b, s, -1)
        if self.tp:
            ts.register_parallel_dim(ctx, -1)  # a reshape changed the split dim's size: re-tag
        x = x + self.o(ctx)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ts.nn.ParallelCrossEntropyLoss()(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def full_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return ts.distributed.gather(out, -1) if ts.get_parallel_dim(out) is not None else out


def train_tp_dp(rank: int) -> dict[str, torch.Tensor]:
    ts.distributed.init_process_group(2)
    tp_rank, dp_rank = ts.distributed.get_rank(), ts.distributed.get_data_parallel_rank()
    assert ts.distributed.get_data_parallel_size() == 2 and tp_rank == rank % 2 and dp_rank == rank // 2
    torch.manual_seed(0)
    ref = Block(tp=False)
    torch.manual_seed(0)
    model = Block(tp=True)
    full0 = ts.collect_state_dict(model, model.state_dict())
    for k, v in ref.state_dict().items():  # RNG: the sharded init equals the single-process one
        close(full0[k], v, 0, 0, f"init {k}")
    ddp = DDP(model, process_group=ts.distributed.get_data_parallel_group())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2, momentum=0.9)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for step in range(20):
        ids = torch.randint(0, VOCAB, (4, SEQ + 1), generator=g)
        inp, tgt = ids[:, :-1], ids[:, 1:]
        loss_ref = lm_loss(ref(inp), tgt)
        opt_ref.zero_grad()
        loss_ref.backward()
        opt_ref.step()
        mine = slice(2 * dp_rank, 2 * dp_rank + 2)
        loss = lm_loss(ddp(inp[mine]), tgt[mine])
        opt.zero_grad()
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        torch.distributed.all_reduce(avg, group=ts.distributed.get_data_parallel_group())
        close(avg / 2, loss_ref, 1e-5, 1e-5, f"loss step {step}")
    full = ts.collect_state_dict(model, model.state_dict())
    for k, v in ref.state_dict().items():
        close(full[k], v, 1e-5, 1e-5, f"trained {k}")
    # replicated parameters (layer norms, row-parallel biases) are identical on every rank
    for name in ("ln1.weight", "o.bias", "fc2.bias"):
        t = model.state_dict()[name].clone()
        ts_all = [torch.empty_like(t) for _ in range(4)]
        torch.distributed.all_gather(ts_all, t)
        for other in ts_all:
            assert torch.equal(other, t), name
    buf = io.BytesIO()
    torch.save({"state_dict": full, "ref": ref.state_dict()}, buf)
    return {"bytes": torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)}


def reload(blob: torch.Tensor, group_size: int) -> None:
    saved = torch.load(io.BytesIO(blob.numpy().tobytes()), weights_only=True)
    ts.distributed.init_process_group(group_size)
    torch.manual_seed(123)
    model = Block(tp=True)
    model.load_state_dict(ts.relocate_state_dict(model, saved["state_dict"]))
    ref = Block(tp=False)
    ref.load_state_dict(saved["ref"])
    ids = torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(2))
    close(full_logits(model, ids), ref(ids), 1e-5, 1e-5, f"reload at TP={group_size}")
    again = ts.collect_state_dict(model, model.state_dict(), rank0_only=True)
    if ts.distributed.get_rank() == 0:
        for k, v in saved["state_dict"].items():
            close(again[k], v, 0, 0, f"re-collect {k} at TP={group_size}")


def ddp_world_ignore(rank: int, size: int) -> None:
    ts.distributed.init_process_group(size)
    torch.manual_seed(5)
    ref = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 4))
    torch.manual_seed(5)
    model = nn.Sequential(ts.nn.ParallelLinear(8, 12, dim=-1), nn.Tanh(), ts.nn.ParallelLinear(12, 4, dim=0))
    names = ts.register_ddp_parameters_to_ignore(model)
    assert names == ["0.weight", "0.bias", "2.weight"], names
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(step))
        for m, o in ((ref, opt_ref), (ddp, opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    close(model[0].weight, shard(ref[0].weight, 0, size, rank), 1e-6, 1e-6, "ddp ignore col w")
    close(model[2].weight, shard(ref[2].weight, 1, size, rank), 1e-6, 1e-6, "ddp ignore row w")
    close(model[2].bias, ref[2].bias, 1e-6, 1e-6, "ddp row bias")


def _ddp_forward_error(model: nn.Module, x: torch.Tensor, **kw: object) -> str:
    ddp = DDP(model, **kw)  # type: ignore[arg-type]
    try:
        ddp(x)
    except RuntimeError as e:
        return str(e)
    return "no error"


def ddp_world_automatic(rank: int, size: int) -> None:
    """TorchShard's pattern without register_ddp_parameters_to_ignore: convert_parallel_linear at
    TP = world registers the split parameters for DDP to ignore (as TorchShard's convert did) and
    DDP(model) trains like the single-process model; a DDP that would average the shards of one
    tensor-parallel group (layers built directly at TP = world, or DDP over the world at TP = 2)
    raises on its first forward instead of averaging different shards."""
    ts.distributed.init_process_group(size)
    torch.manual_seed(7)
    ref = nn.Sequential(nn.Linear(8, 4 * size), nn.Tanh(), nn.Linear(4 * size, 3))
    model = nn.Sequential(nn.Linear(8, 4 * size), nn.Tanh(), nn.Linear(4 * size, 3))
    model.load_state_dict(ref.state_dict())
    model[0] = ts.nn.convert_parallel_linear(model[0], -1)
    assert model[0]._ddp_params_and_buffers_to_ignore == ["weight", "bias"]
    ts.nn.ParallelLinear.convert_parallel_linear(model, 0)  # in place (TorchShard's tests ignore the result)
    assert model._ddp_params_and_buffers_to_ignore == ["0.weight", "0.bias", "2.weight"]
    ddp = DDP(model)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))  # one batch: a single TP group
    ddp(x).square().sum().backward()
    ref(x).square().sum().backward()
    # every shard gets its slice of the full gradient (averaging it with the other ranks' shards,
    # as DDP did without the list, gave wrong gradients without an error)
    close(model[0].weight.grad, shard(ref[0].weight.grad, 0, size, rank), 1e-6, 1e-6, "auto ignore col dW")
    close(model[0].bias.grad, shard(ref[0].bias.grad, 0, size, rank), 1e-6, 1e-6, "auto ignore col db")
    close(model[2].weight.grad, shard(ref[2].weight.grad, 1, size, rank), 1e-6, 1e-6, "auto ignore row dW")
    close(model[2].bias.grad, ref[2].bias.grad, 1e-6, 1e-6, "auto ignore row db")
    # the same layers built directly: nothing registered, DDP over the world is refused
    torch.manual_seed(7)
    direct = nn.Sequential(
        ts.nn.ParallelLinear(8, 4 * size, dim=-1), nn.Tanh(), ts.nn.ParallelLinear(4 * size, 3, dim=0)
    )
    msg = _ddp_forward_error(direct, x)
    assert "averages the split parameters ['0.weight', '0.bias']" in msg, msg
    assert f"over ranks {list(range(size))}" in msg and "register_ddp_parameters_to_ignore" in msg, msg
    ts.register_ddp_parameters_to_ignore(direct)
    assert _ddp_forward_error(direct, x) == "no error"
    # TP = 2 inside a world of 4: convert registers nothing (DDP over the data-parallel group must
    # average the shards over their replicas); DDP over the world is refused, over DP accepted
    ts.distributed.init_process_group(2)
    tp2 = ts.nn.convert_parallel_linear(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), -1)
    assert not hasattr(tp2, "_ddp_params_and_buffers_to_ignore")
    pair = [r for r in range(size) if r // 2 == rank // 2]
    msg = _ddp_forward_error(tp2, x)
    assert f"averages the split parameters ['0.weight', '0.bias'] over ranks {pair}" in msg, msg
    assert "get_data_parallel_group()" in msg, msg
    assert _ddp_forward_error(tp2, x, process_group=ts.distributed.get_data_parallel_group()) == "no error"


def regroup_checkpoint(rank: int, size: int, store: str) -> None:
    """A sharded checkpoint of TP=2 over ranks (0, 1), (2, 3), written with distx_fake; the world
    then re-initialised with permuted ranks (``2 * (rank % 2) + rank // 2``, as the second
    rendezvous of cluster_job.py: processes 1 and 2 swap their place in the mesh) and TP=2
    again; the checkpoint loaded there gives the single-process logits.

    The regrouped groups' state may land at the address of the destroyed one (CPython reuses
    freed memory: some process got its old state's address in 7 of 30 local runs of
    cluster_job.py): every ``id()`` in shardlayers' ``_sharded`` module is 0 here, which forces
    that case, so a mesh cached by the state's id would hand the first layout's coordinates to
    the second and load swapped shards.
    """
    from distx_fake import checkpoint

    folder = os.path.join(os.path.dirname(store), "regroup-checkpoint")
    probe = torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(2))
    with mock.patch.object(shardlayers._sharded, "id", create=True, return_value=0):
        ts.distributed.init_process_group(2)
        torch.manual_seed(0)
        ref = Block(tp=False)
        torch.manual_seed(0)
        model = Block(tp=True)
        checkpoint.save_state_dict(ts.sharded_state_dict(model), checkpoint.FileSystemWriter(folder, sync=False))
        ts.distributed.destroy_process_group()
        destroy_process_group()
        moved = 2 * (rank % 2) + rank // 2
        init_process_group(moved, size, store + ".regrouped")
        ts.distributed.init_process_group(2)
        mesh = shardlayers._sharded.device_mesh()
        coord = list(mesh.get_coordinate() or [])
        assert coord == [moved // 2, moved % 2], f"process {rank} as rank {moved}: mesh coordinate {coord}"
        torch.manual_seed(123)
        model = Block(tp=True)
        target = ts.sharded_state_dict(model)
        checkpoint.load_state_dict(target, checkpoint.FileSystemReader(folder))
        ts.load_sharded_state_dict(model, target)
    with torch.no_grad():
        close(full_logits(model, probe), ref(probe), 1e-5, 1e-5, f"checkpoint loaded on process {rank} as rank {moved}")


def run(rank: int, size: int) -> None:
    """The transformer block in TP=2 x DP=2 (trained, reloaded at TP=4 and TP=1), DDP over the world."""
    assert size == 4
    blob = train_tp_dp(rank)["bytes"]
    reload(blob, 4)
    reload(blob, 1)
    ddp_world_ignore(rank, size)
    ddp_world_automatic(rank, size)
    torch.distributed.barrier()


def body(rank: int, size: int, store: str) -> None:
    """The spawned suite of test_parallel.py: one set of 4 processes runs the layer checks at TP
    sizes 1, 2 and 4, then the TP=2 x DP=2 training, then a checkpoint across a regrouping
    (process start-up, mostly importing torch, costs more CPU than the checks themselves)."""
    init_process_group(rank, size, store)
    torch.set_num_threads(1)
    layers.run(size)
    run(rank, size)
    regroup_checkpoint(rank, size, store)  # re-initialises the world (freeing run()'s DDP modules)
    destroy_process_group()
