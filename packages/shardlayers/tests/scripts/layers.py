"""Spawned body: every layer / dim / loss option against the single-process reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import shardlayers as ts

try:
    from scripts import torchshard_compat
    from scripts.common import close, raises, shard
except ImportError:  # loaded by file path
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from scripts import torchshard_compat
    from scripts.common import close, raises, shard


def check_linear(p: int, r: int) -> None:
    torch.manual_seed(0)
    x_full = torch.randn(3, 5, 12, dtype=torch.float64)
    for dim in (None, -1, 1, 0):
        for out_f, uneven in ((8, False), (7, True)):
            if dim is None and uneven:
                continue
            torch.manual_seed(1)
            ref = (
                nn.Linear(12, out_f, dtype=torch.float64) if dim != 0 else nn.Linear(out_f + 4, 6, dtype=torch.float64)
            )
            torch.manual_seed(1)
            if dim == 0:
                m = ts.nn.ParallelLinear(out_f + 4, 6, dim=0, uneven=uneven, dtype=torch.float64)
            else:
                m = ts.nn.ParallelLinear(12, out_f, dim=dim, uneven=uneven, dtype=torch.float64)
            # RNG: parameters are slices of the single-process layer built with the same seed
            axis = 1 if dim == 0 else 0
            close(m.weight, shard(ref.weight, axis, p, r) if dim is not None else ref.weight, 0, 0, f"init w {dim}")
            close(m.bias, shard(ref.bias, 0, p, r) if dim in (1, -1) else ref.bias, 0, 0, f"init b {dim}")
            xin = x_full if dim != 0 else torch.randn(3, 5, out_f + 4, dtype=torch.float64)
            for tagged_input in (False, True) if dim == 0 else (False,):
                xr = xin.clone().requires_grad_(True)
                yr = ref(xr)
                gy = torch.randn_like(yr)
                (yr * gy).sum().backward()
                m.zero_grad()
                xl = xin.clone().requires_grad_(True)
                inp = xl
                if tagged_input:
                    inp = ts.distributed.scatter(xl, -1)
                    assert ts.get_parallel_dim(inp) == -1
                y = m(inp)
                if dim in (1, -1):
                    assert ts.get_parallel_dim(y) == -1
                    close(y, shard(yr, -1, p, r), what=f"fwd col {dim}")
                    (y * shard(gy, -1, p, r)).sum().backward()
                else:
                    assert ts.get_parallel_dim(y) is None
                    close(y, yr, what=f"fwd {dim}")
                    (y * gy).sum().backward()
                close(xl.grad, xr.grad, what=f"dx {dim} tagged={tagged_input}")
                close(
                    m.weight.grad,
                    shard(ref.weight.grad, axis, p, r) if dim is not None else ref.weight.grad,
                    what=f"dw {dim}",
                )
                gb = shard(ref.bias.grad, 0, p, r) if dim in (1, -1) else ref.bias.grad
                close(m.bias.grad, gb, what=f"db {dim}")
                ref.zero_grad()
    # functional form on the module's shards
    m = ts.nn.ParallelLinear(12, 8, dim=-1, dtype=torch.float64)
    close(ts.nn.functional.parallel_linear(x_full, m.weight, m.bias, -1), m(x_full), 0, 0, "functional")


def check_megatron(p: int, r: int) -> None:
    torch.manual_seed(2)
    d = torch.float64
    ref1, ref2 = nn.Linear(6, 10, dtype=d), nn.Linear(10, 6, dtype=d)
    torch.manual_seed(2)
    col = ts.nn.ColumnParallelLinear(6, 10, gather_output=False, uneven=True, dtype=d)
    row = ts.nn.RowParallelLinear(10, 6, input_is_parallel=True, uneven=True, dtype=d)
    colg = ts.nn.ColumnParallelLinear(6, 10, gather_output=True, uneven=True, dtype=d)
    colg.load_state_dict(col.state_dict())
    x = torch.randn(4, 3, 6, dtype=d)  # [s, b, h]
    ln_ref = nn.LayerNorm(6, dtype=d)
    ln_sp = ts.nn.SequenceParallelLayerNorm(6, dtype=d)
    with torch.no_grad():
        ln_ref.weight.uniform_(0.5, 1.5)
        ln_sp.weight.copy_(ln_ref.weight)
    xr = x.clone().requires_grad_(True)
    yr = ref2(F.gelu(ref1(xr)))
    yr.square().sum().backward()
    # sequence-parallel layer norm: replicated affine parameters get the full gradient
    xl = shard(x, 0, p, r)
    ln_ref(x).square().sum().backward()
    ln_sp(xl).square().sum().backward()
    close(ln_sp.weight.grad, ln_ref.weight.grad, what="sp layernorm dw")
    close(ln_sp.bias.grad, ln_ref.bias.grad, what="sp layernorm db")
    # gather_output gives the full output
    close(colg(x), ref1(x), what="gather_output")
    for sp in (False, True):
        col.sequence_parallel = row.sequence_parallel = sp
        col.zero_grad()
        row.zero_grad()
        xl = x.clone().requires_grad_(True)
        inp = shard(xl, 0, p, r) if sp else xl
        h = F.gelu(col(inp))
        assert ts.get_parallel_dim(h) == -1  # the tag survives the activation
        y = row(h)
        expect = shard(yr, 0, p, r) if sp else yr
        close(y, expect, what=f"mlp fwd sp={sp}")
        y.square().sum().backward()
        close(col.weight.grad, shard(ref1.weight.grad, 0, p, r), what=f"col dw sp={sp}")
        close(col.bias.grad, shard(ref1.bias.grad, 0, p, r), what=f"col db sp={sp}")
        close(row.weight.grad, shard(ref2.weight.grad, 1, p, r), what=f"row dw sp={sp}")
        close(row.bias.grad, ref2.bias.grad, what=f"row db sp={sp}")
        if not sp:
            close(xl.grad, xr.grad, what="mlp dx")
        else:
            # each rank's input chunk gets the gradient of its own sequence chunk
            close(shard(xl.grad, 0, p, r), shard(xr.grad, 0, p, r), what="sp dx")
            close(xl.grad.abs().sum(), shard(xl.grad, 0, p, r).abs().sum(), what="sp dx elsewhere zero")


class _CountAllReduce:
    """Counts torch.distributed.all_reduce calls while active."""

    def __enter__(self) -> _CountAllReduce:
        self.calls = 0
        self._orig = torch.distributed.all_reduce

        def counting(*args: object, **kwargs: object) -> object:
            self.calls += 1
            return self._orig(*args, **kwargs)

        torch.distributed.all_reduce = counting
        return self

    def __exit__(self, *exc: object) -> None:
        torch.distributed.all_reduce = self._orig


def check_shared_input_gradient(p: int, r: int) -> None:
    """Column layers reading one tensor (q/k/v) share one input-gradient all-reduce; the
    gradients equal the single-process ones, also when a reader's output is unused and after a
    second backward through the retained graph; readers of different tensors do not share."""
    d = torch.float64
    torch.manual_seed(4)
    refs = [nn.Linear(8, 12, dtype=d) for _ in range(3)]
    torch.manual_seed(4)
    cols = [ts.nn.ColumnParallelLinear(8, 12, gather_output=False, dtype=d) for _ in range(3)]
    x = torch.randn(5, 8, dtype=d)
    gys = [torch.randn(5, 12, dtype=d) for _ in range(3)]
    for overlap, used in ((True, 3), (True, 2), (False, 3)):  # the last reader's output unused / no overlap
        ts.nn.functional.OVERLAP_GRAD_ALLREDUCE = overlap
        xr = x.clone().requires_grad_(True)
        sum((ref(xr) * gy).sum() for ref, gy in zip(refs[:used], gys)).backward()
        xl = x.clone().requires_grad_(True)
        h = xl * 1.0  # a non-leaf input, as inside a model
        outs = [c(h) for c in cols]
        loss = sum((o * shard(gy, -1, p, r)).sum() for o, gy in zip(outs[:used], gys))
        # a gradient of weights only first (the region's sum is not taken), then the full backward
        (gw,) = torch.autograd.grad(loss, [cols[0].weight], retain_graph=True)
        with _CountAllReduce() as count:
            loss.backward(retain_graph=True)
        assert count.calls == (1 if p > 1 else 0), f"{count.calls} input-gradient all-reduces for 3 readers"
        close(xl.grad, xr.grad, what=f"shared dx ({used} used, overlap={overlap})")
        close(gw, cols[0].weight.grad, what="weight-only gradient")
        for c, ref in zip(cols[:used], refs):
            close(c.weight.grad, shard(ref.weight.grad, 0, p, r), what="shared dw")
        loss.backward()  # the retained graph: the region is reusable
        close(xl.grad, 2 * xr.grad, what="shared dx, second backward")
        for m in (*cols, *refs):
            m.zero_grad()
    ts.nn.functional.OVERLAP_GRAD_ALLREDUCE = True
    # readers of different tensors do not share
    xr = x.clone().requires_grad_(True)
    (refs[0](xr * 1.0).sum() + refs[1](xr * 2.0).sum()).backward()
    xl = x.clone().requires_grad_(True)
    with _CountAllReduce() as count:
        (cols[0](xl * 1.0).sum() + cols[1](xl * 2.0).sum()).backward()
    assert count.calls == (2 if p > 1 else 0), count.calls
    close(xl.grad, xr.grad, what="dx of two regions")


def check_embedding(p: int, r: int) -> None:
    d = torch.float64
    for dim, uneven, nv, nd in (
        (None, False, 10, 6),
        (0, False, 12, 8),
        (0, True, 11, 6),
        (-1, False, 12, 8),
        (-1, True, 10, 7),
    ):
        torch.manual_seed(3)
        ref = nn.Embedding(nv, nd, padding_idx=2, dtype=d)
        torch.manual_seed(3)
        m = ts.nn.ParallelEmbedding(nv, nd, padding_idx=2, dim=dim, uneven=uneven, dtype=d)
        axis = 0 if dim == 0 else 1
        close(m.weight, ref.weight if dim is None else shard(ref.weight, axis, p, r), 0, 0, f"emb init {dim}")
        ids = torch.tensor([[0, 2, 9, 5], [3, 3, 1, nv - 1]])
        yr = ref(ids)
        gy = torch.randn_like(yr)
        (yr * gy).sum().backward()
        y = m(ids)
        # every dim returns the full output, as TorchShard (dim=-1 all-gathers the local lookups)
        assert ts.get_parallel_dim(y) is None
        close(y, yr, what=f"emb fwd {dim}")
        (y * gy).sum().backward()
        close(
            m.weight.grad, ref.weight.grad if dim is None else shard(ref.weight.grad, axis, p, r), what=f"emb dw {dim}"
        )
        close(ts.nn.functional.parallel_embedding(ids, m.weight, 2, dim=dim), y, 0, 0, "emb functional")
        if dim == -1:  # gather_output=False keeps the split, tagged -1
            m.weight.grad = None
            m.gather_output = False
            ys = m(ids)
            assert ts.get_parallel_dim(ys) == -1
            close(ys, shard(yr, -1, p, r), 0, 0, "emb fwd -1 split")
            (ys * shard(gy, -1, p, r)).sum().backward()
            close(m.weight.grad, shard(ref.weight.grad, axis, p, r), what="emb dw -1 split")
            fs = ts.nn.functional.parallel_embedding(ids, m.weight, 2, dim=dim, gather_output=False)
            close(fs, ys, 0, 0, "emb functional split")


def check_cross_entropy(p: int, r: int) -> None:
    torch.manual_seed(4)
    for c in (12, 13):
        logits = torch.randn(7, c, dtype=torch.float64) * 3
        target = torch.tensor([0, 5, c - 1, -100, 3, 7, 1])
        weight = torch.rand(c, dtype=torch.float64) + 0.5
        for w in (None, weight):
            for eps in (0.0, 0.2):
                for red in ("mean", "sum", "none"):
                    xr = logits.clone().requires_grad_(True)
                    lr = F.cross_entropy(xr, target, w, ignore_index=-100, reduction=red, label_smoothing=eps)
                    g = torch.randn_like(lr) if red == "none" else torch.tensor(1.7, dtype=torch.float64)
                    (lr * g).sum().backward()
                    xl = shard(logits, -1, p, r).clone().requires_grad_(True)
                    inp = ts.nn.RegisterParallelDim(-1)(xl)
                    crit = ts.nn.ParallelCrossEntropyLoss(
                        weight=w, ignore_index=-100, reduction=red, label_smoothing=eps
                    )
                    loss = crit(inp, target)
                    what = f"xent c={c} w={w is not None} eps={eps} red={red}"
                    close(loss, lr, 1e-10, 1e-10, what)
                    (loss * g).sum().backward()
                    close(xl.grad, shard(xr.grad, -1, p, r), 1e-10, 1e-10, what + " grad")
        # 3-D logits [b, s, C] with the class dim last
        l3 = torch.randn(2, 3, c, dtype=torch.float64)
        t3 = torch.randint(0, c, (2, 3))
        ref = F.cross_entropy(l3.reshape(-1, c), t3.reshape(-1))
        xl = ts.nn.RegisterParallelDim(-1)(shard(l3, -1, p, r))
        close(ts.nn.functional.parallel_cross_entropy(xl, t3), ref, 1e-10, 1e-10, "3d")
    # float16 / bfloat16 logits: float32 math, compared with the float32 reference
    for dt, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
        logits = (torch.randn(16, 10) * 4).to(dt)
        target = torch.randint(0, 10, (16,))
        xr = logits.float().requires_grad_(True)
        lr = F.cross_entropy(xr, target, label_smoothing=0.1)
        lr.backward()
        xl = shard(logits, -1, p, r).clone().requires_grad_(True)
        loss = ts.nn.functional.parallel_cross_entropy(ts.nn.RegisterParallelDim(-1)(xl), target, label_smoothing=0.1)
        assert loss.dtype == torch.float32
        close(loss, lr, 1e-5, 1e-5, f"{dt} loss")
        loss.backward()
        assert xl.grad is not None and xl.grad.dtype == dt
        close(xl.grad, shard(xr.grad, -1, p, r), tol, tol, f"{dt} grad")
    # untagged logits: plain cross-entropy
    lg = torch.randn(4, 5)
    tg = torch.tensor([1, 0, 4, 2])
    close(ts.nn.functional.parallel_cross_entropy(lg, tg), F.cross_entropy(lg, tg), 0, 0, "untagged")


def check_state_dict_and_convert(p: int, r: int) -> None:
    torch.manual_seed(5)
    ref = nn.Sequential(nn.Linear(6, 9), nn.ReLU(), nn.Sequential(nn.Linear(9, 4), nn.Embedding(5, 3)))
    full = ref.state_dict()
    model = ts.nn.convert_parallel_linear(ref, dim=-1, uneven=True)
    model = ts.nn.convert_parallel_embedding(model, dim=0, uneven=True)
    assert isinstance(model[0], ts.nn.ParallelLinear) and isinstance(model[2][0], ts.nn.ParallelLinear)  # nested
    assert isinstance(model[2][1], ts.nn.ParallelEmbedding)
    close(model[2][0].weight, shard(full["2.0.weight"], 0, p, r), 0, 0, "convert nested")
    for rank0_only in (False, True):
        got = ts.collect_state_dict(model, model.state_dict(), rank0_only=rank0_only)
        if rank0_only and r != 0:
            assert len(got) == 0
            continue
        assert list(got) == list(full)
        for k in full:
            close(got[k], full[k], 0, 0, f"collect {k}")
            assert got[k].device.type == "cpu"
    sd = ts.relocate_state_dict(model, full)
    model.load_state_dict(sd)
    # prefix
    wrapped = nn.ModuleDict({"m": model})
    got = ts.collect_state_dict(model, {"x." + k: v for k, v in model.state_dict().items()}, prefix="x.")
    assert set(got) == {"x." + k for k in full}
    names = ts.register_ddp_parameters_to_ignore(wrapped)
    assert names == ["m.0.weight", "m.0.bias", "m.2.0.weight", "m.2.0.bias", "m.2.1.weight"], names
    # the seed example: dim=None layer round-trips unchanged
    plain = ts.nn.ParallelLinear(20, 30)
    sd1 = ts.collect_state_dict(plain, plain.state_dict(keep_vars=True))
    assert all(sd1[k] is v for k, v in plain.state_dict(keep_vars=True).items())
    # parameters replaced wholesale (deferred-init materialisation, assign=True) keep their tags
    m = ts.nn.ParallelLinear(6, 8, dim=-1)
    m.load_state_dict({k: v.clone() for k, v in m.state_dict().items()}, assign=True)
    assert ts.get_parallel_dim(m.weight) == -1 and ts.get_parallel_dim(m.bias) == -1
    e = ts.nn.ParallelEmbedding(8, 4, dim=0)
    e._parameters["weight"] = nn.Parameter(torch.zeros_like(e.weight))
    assert ts.get_parallel_dim(e.weight) == 0
    # torch.func.functional_call swaps tensors into _parameters (the tools' training job does this)
    xs = torch.randn(2, 6)
    params = {k: v * 1.0 for k, v in m.named_parameters()}
    close(torch.func.functional_call(m, params, (xs,)), m(xs), 0, 0, "functional_call")
    assert ts.get_parallel_dim(m.weight) == -1 and isinstance(m.weight, nn.Parameter)
    # RNG tracker: the model-parallel stream differs between TP ranks, the default one does not
    ts.random.manual_seed(11)
    with ts.random.get_rng_tracker().fork():
        local = torch.rand(3)
    shared = torch.rand(3)
    both = [torch.empty(6) for _ in range(p)]
    torch.distributed.all_gather(both, torch.cat([local, shared]), group=ts.distributed.get_group())
    for other_rank, other in enumerate(both):
        assert torch.equal(other[3:], shared)
        assert torch.equal(other[:3], local) == (other_rank == r)
    # relocate with the wrong full shape
    bad = dict(full)
    bad["0.weight"] = torch.zeros(9, 7)
    raises(ValueError, ts.relocate_state_dict, model, bad, match="expected a full tensor")


def check_tags_and_errors(p: int, r: int) -> None:
    col = ts.nn.ParallelLinear(4, 8, dim=-1)
    row = ts.nn.ParallelLinear(8, 4, dim=0)
    x = torch.randn(5, 4)
    h = col(x)
    for op in (
        torch.relu,
        F.gelu,
        torch.tanh,
        lambda t: F.dropout(t, 0.5),
        lambda t: t * 2 + 1,
        lambda t: t.view(5, 1, -1),
        lambda t: t.reshape(1, 5, -1),
        lambda t: t.unsqueeze(0),
        lambda t: t[1:3],
    ):
        assert ts.get_parallel_dim(op(h)) == -1
    assert ts.get_parallel_dim(h.sum(-1)) is None
    assert ts.get_parallel_dim(h.t()) is None
    # tag mismatch
    raises(ValueError, col, h, match="tag mismatch")
    t0 = torch.randn(5, 8)
    ts.register_parallel_dim(t0, 0)
    raises(ValueError, row, t0, match="tag mismatch")
    wrong = ts.nn.RegisterParallelDim(-1)(torch.randn(5, 8 // p + 1))
    raises(ValueError, row, wrong, match="tag mismatch")
    # logits tagged 0 (rows split, classes full) are plain logits for the loss, as TorchShard
    t5 = torch.tensor([1, 0, 7, 3, 2])
    close(ts.nn.functional.parallel_cross_entropy(t0, t5), F.cross_entropy(t0, t5), 0, 0, "xent tag 0")
    # bad dims / sizes
    for bad in (2, -2, "x", True):
        raises(ValueError, ts.nn.ParallelLinear, 4, 4, dim=bad, match="dim must be one of")
        raises(ValueError, ts.nn.ParallelEmbedding, 4, 4, dim=bad, match="dim must be one of")
        raises(ValueError, ts.register_parallel_dim, torch.zeros(1), bad, match="parallel_dim")
    if p > 1:
        raises(ValueError, ts.nn.ParallelLinear, 4, 5, dim=-1, match="not divisible")
        raises(ValueError, ts.nn.ParallelEmbedding, 5, 4, dim=0, match="not divisible")
    raises(ValueError, ts.nn.ParallelCrossEntropyLoss, reduction="avg", match="reduction")
    raises(ValueError, ts.nn.ParallelCrossEntropyLoss, label_smoothing=1.5, match="label_smoothing")
    lg = ts.nn.RegisterParallelDim(-1)(torch.randn(3, 4))
    raises(IndexError, ts.nn.functional.parallel_cross_entropy, lg, torch.tensor([0, 1, 4 * p]), match="out of bounds")
    raises(TypeError, ts.nn.functional.parallel_cross_entropy, lg, torch.zeros(3), match="target")
    raises(ValueError, ts.nn.functional.parallel_cross_entropy, lg, torch.zeros(4, dtype=torch.int64), match="shape")
    raises(
        ValueError,
        ts.nn.functional.parallel_cross_entropy,
        lg,
        torch.zeros(3, dtype=torch.int64),
        weight=torch.ones(3),
        match="weight must have shape",
    )
    raises(ValueError, ts.distributed.init_process_group, 3 if p != 3 else 5, match="divide")
    raises(TypeError, ts.distributed.init_process_group, 1.0, match="int")
    raises(ValueError, ts.nn.ColumnParallelLinear, 4, 4, gather_output=True, pad_to_multiple_of=8, match="incompatible")
    raises(ValueError, ts.nn.ParallelLinear, 4, 4, dim=0, pad_to_multiple_of=8, match="column dim")
    raises(ValueError, ts.nn.ParallelEmbedding, 4, 4, dim=-1, pad_to_multiple_of=8, match="dim=0")
    raises(TypeError, ts.distributed.scatter, [1], match="tensor")
    raises(IndexError, ts.distributed.gather, torch.zeros(2), 3, match="out of range")
    # autograd ops: closed form
    a = torch.arange(6.0).reshape(2, 3).requires_grad_(True)
    s = ts.distributed.reduce(a)
    close(s, a * p, 0, 0, "reduce")
    c = ts.distributed.copy(a)
    c.sum().backward()
    close(a.grad, torch.full((2, 3), float(p)), 0, 0, "copy grad")
    b = torch.arange(8.0).reshape(2, 4).requires_grad_(True)
    sc = ts.distributed.scatter(b, -1)
    close(sc, shard(b, -1, p, r), 0, 0, "scatter")
    ga = ts.distributed.gather(sc, -1)
    close(ga, b, 0, 0, "gather")
    ga.sum().backward()
    close(b.grad, torch.ones(2, 4), 0, 0, "gather/scatter grad")
    assert ts.distributed.get_group_size() == p and ts.distributed.get_rank() == r


def run(world: int) -> None:
    """Every check at every tensor-parallel size dividing the world (1, 2, 4): at TP size p the
    world holds world/p independent TP groups running the same checks (the TorchShard checks'
    broadcasts from global rank 0 and world all-gathers included)."""
    assert ts.distributed.get_world_size() == world
    for p in (1, 2, 4):
        if world % p:
            continue
        ts.distributed.init_process_group(p)
        r = ts.distributed.get_rank()
        check_linear(p, r)
        check_megatron(p, r)
        check_shared_input_gradient(p, r)
        check_embedding(p, r)
        check_cross_entropy(p, r)
        check_state_dict_and_convert(p, r)
        check_tags_and_errors(p, r)
        torchshard_compat.checks(p, r)
        torch.distributed.barrier()
