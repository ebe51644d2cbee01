"""Spawned body (4 processes): a Hugging Face LlamaForCausalLM parallelized with ts.llama_plan,
trained 10 steps against the single-process model (logits, loss, every gradient to 1e-5), with
and without sequence parallel, from deferred_init (no full weight ever built), in TP=2 and
TP=2 x DP=2; the DTensor-style plan; plan errors; sharded checkpoints reloaded at TP=4, TP=1
and in one process."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import shardlayers as ts
from distkit_common.testing import destroy_process_group, init_process_group
from shardlayers._tag import shard_extent

try:
    from scripts.common import close, raises
except ImportError:  # loaded by file path
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from scripts.common import close, raises

VOCAB, SEQ, STEPS = 101, 8, 10  # 101 divides neither 2 nor 4: the vocabulary is padded


def config(kv_heads: int) -> object:
    from transformers import LlamaConfig

    # 8 heads of 6: q/k/v shapes differ from each other's shards (see check_never_full)
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        use_cache=False,
        pad_token_id=0,
    )


def build(cfg: object, seed: int, deferred: bool = False) -> nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # built in float64 (not .double()'d: see docs/packages/shardlayers/guide.md)
    try:
        if deferred:
            from distx_fake.deferred_init import deferred_init

            return deferred_init(LlamaForCausalLM, cfg)
        return LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)


def full_logits(logits: torch.Tensor) -> torch.Tensor:
    """The unpadded logits of every class from this rank's vocab-split (padded) logits."""
    p, r = ts.distributed.get_group_size(), ts.distributed.get_rank()
    chunk = -(-VOCAB // p)
    real = [max(0, min(chunk, VOCAB - i * chunk)) for i in range(p)]
    local = logits.as_subclass(torch.Tensor)[..., : real[r]].contiguous()
    pad = torch.zeros(*local.shape[:-1], chunk - real[r], dtype=local.dtype)
    bufs = [torch.empty(*local.shape[:-1], chunk, dtype=local.dtype) for _ in range(p)]
    dist.all_gather(bufs, torch.cat([local, pad], -1), group=ts.distributed.get_group())
    return torch.cat([b[..., :n] for b, n in zip(bufs, real)], -1)


def compare_grads(model: nn.Module, ref: nn.Module, what: str, tol: float = 1e-5) -> None:
    """Every gradient: this rank's real shard equals the single-process slice; padding gets none."""
    p, r = ts.distributed.get_group_size(), ts.distributed.get_rank()
    refp = dict(ref.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(refp), (names, list(refp))
    for name, param in model.named_parameters():
        axis, _, start, n = shard_extent(param, p, r)
        g = param.grad
        assert g is not None, f"{what}: no gradient for {name}"
        if axis is None:
            close(g, refp[name].grad, tol, tol, f"{what} grad {name}")
        else:
            close(g.narrow(axis, 0, n), refp[name].grad.narrow(axis, start, n), tol, tol, f"{what} grad {name}")
            if g.shape[axis] > n:
                assert torch.all(g.narrow(axis, n, g.shape[axis] - n) == 0), f"{what}: padding of {name} got a gradient"


def train(model: nn.Module, ref: nn.Module, data: torch.Generator, what: str, dp: int = 1, dp_rank: int = 0) -> None:
    """STEPS SGD steps; each: logits, loss (the model's own labels= loss) and every gradient vs ref."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    inner = model.module if isinstance(model, DDP) else model
    for step in range(STEPS):
        ids = torch.randint(1, VOCAB, (2 * dp, SEQ), generator=data)
        out_ref = ref(ids, labels=ids)
        opt_ref.zero_grad()
        out_ref.loss.backward()
        mine = ids[2 * dp_rank : 2 * dp_rank + 2]
        out = model(mine, labels=mine)
        assert ts.get_parallel_dim(out.logits) == -1  # split along the vocabulary, never gathered
        opt.zero_grad()
        out.loss.backward()
        close(
            full_logits(out.logits), out_ref.logits[2 * dp_rank : 2 * dp_rank + 2], 1e-5, 1e-5, f"{what} logits {step}"
        )
        loss = out.loss.detach().clone()
        if dp > 1:
            dist.all_reduce(loss, group=ts.distributed.get_data_parallel_group())
        close(loss / dp, out_ref.loss, 1e-5, 1e-5, f"{what} loss {step}")
        compare_grads(inner, ref, f"{what} step {step}")
        opt.step()
        opt_ref.step()


def pending_closures(model: nn.Module, names: list[str]) -> dict[str, list[object]]:
    """The recorded ops that would build each named deferred parameter (to check they never run)."""
    params = dict(model.named_parameters())
    return {n: params[n]._distx_graph.closure(params[n]) for n in names}


def check_errors(p: int) -> None:
    """Bad plans raise before anything is changed."""
    cfg = config(2)
    m = build(cfg, 0)
    before = {n: type(x) for n, x in m.named_modules()}
    raises(
        ValueError, ts.parallelize_module, m, {"model.layers.*.self_attn.qproj": "colwise"}, match="matches no module"
    )
    raises(ValueError, ts.parallelize_module, m, {"model.embed_tokens": "diagonal"}, match="unknown style")
    raises(TypeError, ts.parallelize_module, m, {"model.norm": "colwise"}, match="does not apply")
    raises(TypeError, ts.parallelize_module, m, {"lm_head": "vocab"}, match="nn.Embedding")
    raises(TypeError, ts.parallelize_module, m, {"model.layers.0.mlp.up_proj": "sequence"}, match="sequence")
    raises(TypeError, ts.parallelize_module, m, {"model.embed_tokens": 3}, match="style name")
    raises(TypeError, ts.parallelize_module, m, ["lm_head"], match="dict")
    raises(
        ValueError,
        ts.parallelize_module,
        m,
        {"*.q_proj": "colwise", "model.layers.0.self_attn.q_proj": "rowwise"},
        match="matched by",
    )
    raises(
        ValueError, ts.parallelize_module, m, {"lm_head": "vocab_head"}, make_vocab_size_divisible_by=0, match=">= 1"
    )
    if p > 1:  # 101 classes / 80 features over 2 ranks, 1 key/value head
        plan = {"model.embed_tokens": "vocab", "model.layers.*.self_attn.q_proj": "colwise"}
        raises(ValueError, ts.parallelize_module, m, plan, match="pad")
        ts.parallelize_module(build(cfg, 0), plan, uneven=True)  # allowed with uneven shards
        raises(ValueError, ts.parallelize_module, build(config(1), 0), {"*.k_proj": "colwise"}, match="heads")
    assert {n: type(x) for n, x in m.named_modules()} == before  # nothing was changed


def dtensor_plan() -> dict[str, object]:
    """The DTensor sequence-parallel plan of the same model (torchtitan / PyTorch tutorial style)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    attn_in = PrepareModuleInput(
        input_kwarg_layouts={"hidden_states": Shard(1)}, desired_input_kwarg_layouts={"hidden_states": Replicate()}
    )
    return {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.layers.*.input_layernorm": SequenceParallel(),
        "model.layers.*.self_attn": attn_in,
        "model.layers.*.self_attn.q_proj": ColwiseParallel(),
        "model.layers.*.self_attn.k_proj": ColwiseParallel(),
        "model.layers.*.self_attn.v_proj": ColwiseParallel(),
        "model.layers.*.self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "model.layers.*.post_attention_layernorm": SequenceParallel(),
        "model.layers.*.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "model.layers.*.mlp.gate_proj": ColwiseParallel(),
        "model.layers.*.mlp.up_proj": ColwiseParallel(),
        "model.layers.*.mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }


def run_tp2(pair: int) -> None:
    """TP=2 (shardlayers' groups of 2 already made). The two TP pairs of the 4 processes share the
    training scenarios: pair 0 eager without sequence parallel, pair 1 from deferred_init with
    sequence parallel; both then run the DTensor plan and the plan errors."""
    cfg = config(2)
    sp, deferred = (False, False) if pair == 0 else (True, True)
    ref = build(cfg, 0)
    model = build(cfg, 0, deferred)
    sharded = [n for n, prm in model.named_parameters() if prm.dim() == 2]
    pending = pending_closures(model, sharded) if deferred else {}
    ts.parallelize_module(model, ts.llama_plan(sequence_parallel=sp), make_vocab_size_divisible_by=8)
    for name, nodes in pending.items():  # the ops building a full weight never ran
        assert nodes and not any(node.done for node in nodes), f"{name} was materialized whole"
    train(model, ref, torch.Generator().manual_seed(1), f"tp2 sp={sp} deferred={deferred}")
    # a DTensor plan ports by changing the import (and DTensor's call order works)
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(ts.distributed.get_group(), "cpu")
    ref, model = build(cfg, 0), build(cfg, 0)
    ts.parallelize_module(model, mesh, dtensor_plan(), make_vocab_size_divisible_by=8)
    ids = torch.randint(1, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    out, out_ref = model(ids, labels=ids), ref(ids, labels=ids)
    out.loss.backward()
    out_ref.loss.backward()
    close(full_logits(out.logits), out_ref.logits, 1e-5, 1e-5, "dtensor plan logits")
    close(out.loss, out_ref.loss, 1e-5, 1e-5, "dtensor plan loss")
    compare_grads(model, ref, "dtensor plan")
    check_errors(ts.distributed.get_group_size())


def body(rank: int, size: int, store: str, folder: str) -> None:
    """The spawned suite of test_models.py on 4 processes: the TP=2 scenarios (split between the
    two TP pairs), then TP=2 x DP=2 with checkpoints reloaded at TP=4 and TP=1, then (rank 0, the
    process groups gone) the checkpoint in one process. One start-up for all: importing torch and
    transformers costs each process more CPU than these tiny models' training."""
    init_process_group(rank, size, store)
    torch.set_num_threads(1)
    assert size == 4
    ts.distributed.init_process_group(2)
    run_tp2(ts.distributed.get_data_parallel_rank())
    dist.barrier()
    run_tp2dp2(rank, folder)
    dist.barrier()
    ts.distributed.destroy_process_group()
    destroy_process_group()  # frees run_tp2dp2's DDP first
    if rank == 0:
        load_in_one_process(folder)


def run_tp2dp2(rank: int, folder: str) -> None:
    """TP=2 x DP=2 (DDP over the data-parallel group), sequence parallel; sharded checkpoints
    saved with distx_fake.checkpoint and DCP, reloaded at TP=4 and TP=1: same logits."""
    import torch.distributed.checkpoint as dcp

    from distx_fake import checkpoint

    ts.distributed.init_process_group(2)
    cfg = config(4)
    ref, model = build(cfg, 0), build(cfg, 0)
    ts.parallelize_module(model, ts.llama_plan(sequence_parallel=True), make_vocab_size_divisible_by=8)
    ddp = DDP(model, process_group=ts.distributed.get_data_parallel_group())
    train(ddp, ref, torch.Generator().manual_seed(2), "tp2xdp2", dp=2, dp_rank=ts.distributed.get_data_parallel_rank())
    probe = torch.randint(1, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expect = ref(probe).logits
        close(full_logits(model(probe).logits), expect, 1e-5, 1e-5, "trained logits")
    sd = ts.sharded_state_dict(model)
    checkpoint.save_state_dict(sd, checkpoint.FileSystemWriter(os.path.join(folder, "distx")))
    dcp.save(sd, checkpoint_id=os.path.join(folder, "dcp"))
    if rank == 0:
        torch.save(expect, os.path.join(folder, "expect.pt"))
    for tp, fmt in ((4, "distx"), (1, "dcp")):
        ts.distributed.init_process_group(tp)
        fresh = build(cfg, 123)
        ts.parallelize_module(fresh, ts.llama_plan(), make_vocab_size_divisible_by=8)
        target = ts.sharded_state_dict(fresh)
        if fmt == "distx":
            checkpoint.load_state_dict(target, checkpoint.FileSystemReader(os.path.join(folder, "distx")))
        else:
            dcp.load(target, checkpoint_id=os.path.join(folder, "dcp"))
        ts.load_sharded_state_dict(fresh, target)
        with torch.no_grad():
            close(full_logits(fresh(probe).logits), expect, 1e-5, 1e-5, f"reloaded at TP={tp} ({fmt})")


def load_in_one_process(folder: str) -> None:
    """The TP=2 x DP=2 checkpoint into a plain single-process LlamaForCausalLM (no process group)."""
    from distx_fake import checkpoint

    model = build(config(4), 7)
    sd = ts.sharded_state_dict(model)  # plain tensors without process groups
    checkpoint.load_state_dict(sd, checkpoint.FileSystemReader(os.path.join(folder, "distx")), no_dist=True)
    ts.load_sharded_state_dict(model, sd)
    probe = torch.randint(1, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(4))
    expect = torch.load(os.path.join(folder, "expect.pt"), weights_only=True)
    with torch.no_grad():
        close(model(probe).logits, expect, 1e-5, 1e-5, "reloaded in one process")
