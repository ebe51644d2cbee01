"""TorchShard's own tests (kaiyuyue/torchshard tests/*.py) and the seed's documented examples,
ported to shardlayers and run inside the spawned layer body (any tensor-parallel size p).

Deliberate differences from TorchShard are asserted as such (docs/packages/shardlayers/from-original.md): gathered tensors
are untagged, the row-parallel bias is not tagged as split, ``register_ddp_parameters_to_ignore``
lists only split parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import shardlayers as ts

try:
    from scripts.common import close, raises
except ImportError:  # loaded by file path
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from scripts.common import close, raises

TOL = {"atol": 1e-10, "rtol": 1e-10}
#: tests/testing.py's ``threshold`` (float32, the default dtype of TorchShard's tests)
TS_THRESHOLD = 1e-6


def _tol() -> dict[str, float]:
    """TorchShard's threshold for its float32 tests, 1e-10 for the float64 ones."""
    if torch.get_default_dtype() == torch.float32:
        return {"atol": TS_THRESHOLD, "rtol": 0.0}
    return TOL


def _loose() -> dict[str, float]:
    """TorchShard's threshold plus a relative float32 term (a few ulps) for values well above 1."""
    if torch.get_default_dtype() == torch.float32:
        return {"atol": TS_THRESHOLD, "rtol": 5e-7}
    return TOL


def _split(t: torch.Tensor, n: int, dim: int, r: int) -> torch.Tensor:
    return torch.split(t, n, dim=dim)[r]


class IdentityLayer(nn.Module):
    def __init__(self, size: Any, scale: float = 1.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(scale * torch.randn(size))

    def forward(self) -> torch.Tensor:
        return self.weight


class IdentityLayer2D(nn.Module):
    def __init__(self, m: int, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(m, n))
        nn.init.xavier_normal_(self.weight)

    def forward(self) -> torch.Tensor:
        return self.weight


def check_seed_examples(p: int, r: int) -> None:
    """The seed's examples: attribute names, slice, shapes of ParallelLinear(20, 30), collect /
    relocate, get/register_parallel_dim, register_parallel_attribute, DDP ignore list."""
    assert ts._PARALLEL_DIM == "parallel_dim" and ts._ORDER_TYPE == ts._ORDER_ATTR == "order_type"
    assert ts.nn.shard_init_helper_ is ts.nn.init.shard_init_helper_
    # slice
    chunks = ts.slice(torch.empty(3, 10), 2, dim=-1)
    assert isinstance(chunks, tuple) and [tuple(c.shape) for c in chunks] == [(3, 5), (3, 5)]
    x = torch.arange(12.0).reshape(4, 3).t()  # [3, 4], not contiguous
    a, b = ts.slice(x, 2, dim=-1, contiguous=True)
    assert a.is_contiguous() and torch.equal(a, x[:, :2]) and torch.equal(b, x[:, 2:])
    # ParallelLinear(20, 30): TorchShard's code stores nn.Linear's [out, in] (the seed's comments
    # print (in, out)-ordered sizes, which its own code and tests contradict)
    for dim in (-1, 1, 0, None):
        if dim in (-1, 1) and 30 % p:
            continue
        torch.manual_seed(0)
        m = ts.nn.ParallelLinear(20, 30, dim=dim)
        w_shape = {-1: (30 // p, 20), 1: (30 // p, 20), 0: (30, 20 // p), None: (30, 20)}[dim]
        b_shape = (30 // p,) if dim in (-1, 1) else (30,)
        assert tuple(m.weight.shape) == w_shape and tuple(m.bias.shape) == b_shape, (dim, m.weight.shape)
        assert m.weight.parallel_dim == dim and getattr(m.weight, ts._ORDER_TYPE) == 0
        assert ts.get_parallel_dim(m.bias) == (dim if dim in (-1, 1) else None)
        torch.manual_seed(0)
        ref = nn.Linear(20, 30)
        sd = ts.collect_state_dict(m, m.state_dict())
        assert list(sd) == ["weight", "bias"] and type(sd["weight"]) is torch.Tensor
        close(sd["weight"], ref.weight, 0, 0, f"collect weight {dim}")
        close(sd["bias"], ref.bias, 0, 0, f"collect bias {dim}")
        rel = ts.relocate_state_dict(m, sd)
        assert tuple(rel["weight"].shape) == w_shape and tuple(rel["bias"].shape) == b_shape
        close(rel["weight"], m.weight, 0, 0, f"relocate {dim}")
        m.load_state_dict(rel)
        # keep_vars with dim=None: the same keys and values
        if dim is None:
            s2 = m.state_dict(keep_vars=True)
            s1 = ts.collect_state_dict(m, m.state_dict(keep_vars=True))
            assert list(s1) == list(s2) and all(s1[k] is s2[k] for k in s1)
    # get_parallel_dim example
    uneven = 30 % p != 0
    m = ts.nn.ParallelLinear(30, 30, dim=-1, uneven=uneven)
    inp = torch.empty((20, 30)).uniform_()
    out = m(inp)
    assert ts.get_parallel_dim(out) == -1 and ts.get_parallel_dim(inp) is None
    assert ts.get_parallel_dim(None) is None  # e.g. an absent bias, as TorchShard
    data = torch.empty((20, 30))
    assert ts.get_parallel_dim(data) is None
    ts.register_parallel_dim(data, -1)
    assert ts.get_parallel_dim(data) == -1 and data.parallel_dim == -1
    ts.register_parallel_dim(data)  # TorchShard's default value None
    assert ts.get_parallel_dim(data) is None
    param = torch.empty((20, 30))
    ts.register_parallel_attribute(param, -1, 1)
    assert ts.get_parallel_dim(param) == -1 and param.order_type == 1
    ts.set_attribute(param, 0)
    assert param.parallel_dim == 0 and param.order_type == 0
    e = ts.nn.ParallelEmbedding(8 * p, 4, dim=0)
    assert e.weight.parallel_dim == 0 and e.weight.order_type == 1
    # register_ddp_parameters_to_ignore example (+ split layers)
    for dim, expect in ((None, []), (-1, ["layer2.weight", "layer2.bias"]), (0, ["layer2.weight"])):
        md = nn.ModuleDict({"layer1": nn.Linear(20, 20), "layer2": ts.nn.ParallelLinear(20, 20 * p, dim=dim)})
        names = ts.register_ddp_parameters_to_ignore(md)
        assert names == expect, (dim, names)
        assert list(md._ddp_params_and_buffers_to_ignore) == expect
    # RegisterParallelDim: TorchShard's default (None), lists / tuples, the input tagged in place
    t1, t2 = torch.randn(2, 3), torch.randn(2, 3)
    assert ts.nn.RegisterParallelDim().dim is None
    y1, y2 = ts.nn.RegisterParallelDim(-1)((t1, t2))
    assert t1.parallel_dim == -1 and t2.parallel_dim == -1
    assert ts.get_parallel_dim(y1) == -1 and ts.get_parallel_dim(F.gelu(y2)) == -1
    raises(TypeError, ts.nn.RegisterParallelDim(-1), 3, match="tensor")
    # scatter tags the chunk with the split dim, gather returns an untagged full tensor
    z = torch.randn(4 * p, 2 * p)
    assert ts.get_parallel_dim(ts.distributed.scatter(z, dim=0)) == 0
    assert ts.get_parallel_dim(ts.distributed.scatter(z, dim=1)) == 1
    assert ts.get_parallel_dim(ts.distributed.scatter(z, dim=-1)) == -1
    assert ts.get_parallel_dim(ts.distributed.gather(ts.distributed.scatter(z, dim=-1), dim=-1)) is None
    # the dist docs' examples: scatter / gather shapes, reduce in place outside autograd
    assert tuple(ts.distributed.scatter(torch.empty(6 * p, 8 * p), dim=1).shape) == (6 * p, 8)
    assert tuple(ts.distributed.gather(torch.empty(6, 8), dim=0).shape) == (6 * p, 8)
    tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * r
    ts.distributed.reduce(tensor)
    assert tensor.tolist() == [p + p * (p - 1), 2 * p + p * (p - 1)], tensor
    g = torch.ones(3, requires_grad=True)
    assert torch.equal(ts.distributed.reduce(g), torch.full((3,), float(p))) and torch.equal(g, torch.ones(3))
    # reprs as TorchShard
    assert repr(ts.nn.ParallelLinear(4, 4 * p, dim=-1)).endswith(
        "(in_features=4, out_features=" + f"{4 * p}, bias=True, dim=-1)"
    )
    assert (
        repr(ts.nn.ParallelEmbedding(4 * p, 3, padding_idx=1, dim=0))
        == f"ParallelEmbedding({4 * p}, 3, padding_idx=1, dim=0)"
    )
    assert repr(ts.nn.ParallelEmbedding(5, 3)) == "ParallelEmbedding(5, 3)"


def check_layers(p: int, r: int) -> None:
    """tests/test_layers.py: row / column ParallelLinear against closed-form gradients, ParallelEmbedding."""
    seed, in_c, out_c, batch = 12345, 13, 17, 7
    in_f, out_f = in_c * p, out_c * p
    # row parallel (dim=0): the untagged input is scattered, the gradient all-gathered
    torch.manual_seed(seed)
    ident = IdentityLayer2D(batch, in_f)
    lin = ts.nn.ParallelLinear(in_f, out_f, bias=True, dim=0)
    loss_weight = torch.randn([batch, out_f])
    out = lin(ident())
    torch.mul(out, loss_weight).sum().backward()
    dldy, x, a = loss_weight, ident.weight, lin.weight
    dlda = dldy.t().matmul(x)
    dldb = torch.ones(batch, 1).t().matmul(dldy).view(-1)
    dldx = dldy.matmul(a)
    close(lin.weight.grad, _split(dlda, in_c, 1, r), **_tol(), what="row dW")
    close(lin.bias.grad, dldb, **_tol(), what="row db")
    close(ident.weight.grad, ts.distributed.gather(dldx, dim=-1), **_tol(), what="row dX")
    assert ts.get_parallel_dim(out) is None
    # column parallel (dim=-1): split output, gathered for the loss
    torch.manual_seed(seed)
    ident = IdentityLayer2D(batch, in_f)
    lin = ts.nn.ParallelLinear(in_f, out_f, bias=True, dim=-1)
    loss_weight = torch.randn([batch, out_f])
    out = lin(ident())
    assert ts.get_parallel_dim(out) == -1 and tuple(out.shape) == (batch, out_c)
    torch.mul(ts.distributed.gather(out, dim=-1), loss_weight).sum().backward()
    full_a = ts.distributed.gather(lin.weight.detach(), dim=0)
    dldy, x = loss_weight, ident.weight
    dlda = dldy.t().matmul(x)
    dldb = torch.ones(batch, 1).t().matmul(dldy).view(-1)
    close(lin.weight.grad, _split(dlda, out_c, 0, r), **_tol(), what="col dW")
    close(lin.bias.grad, _split(dldb, out_c, 0, r), **_tol(), what="col db")
    close(ident.weight.grad, dldy.matmul(full_a), **_tol(), what="col dX")
    # ParallelEmbedding for dim None / 0 / -1: full output, gradients are the slices
    b, s, vocab, hidden = 17, 23, 48, 16
    torch.manual_seed(123)
    ids = torch.LongTensor(size=(b, s)).random_(0, vocab)
    loss_weight = torch.randn([b, s, hidden])
    torch.manual_seed(1236)
    orig = nn.Embedding(vocab, hidden)
    y = orig(ids)
    loss_orig = torch.mul(y, loss_weight)
    loss_orig.sum().backward()
    for dim in (None, 0, -1):
        torch.manual_seed(2827)
        emb = ts.nn.ParallelEmbedding(vocab, hidden, dim=dim)
        src = orig.weight.data if dim is None else ts.distributed.scatter(orig.weight.data, dim=dim)
        emb.weight.data.copy_(src)
        loss_par = torch.mul(emb(ids), loss_weight)
        loss_par.sum().backward()
        close(loss_par, loss_orig, **_tol(), what=f"emb loss {dim}")
        g = orig.weight.grad if dim is None else ts.distributed.scatter(orig.weight.grad, dim=dim)
        close(emb.weight.grad, g, **_tol(), what=f"emb grad {dim}")
    # TorchShard's positional functional signature (num_embeddings before dim), _weight
    emb = ts.nn.ParallelEmbedding(vocab, hidden, None, None, 2.0, False, False, orig.weight.detach(), 0)
    close(emb.weight, ts.distributed.scatter(orig.weight.data, dim=0), 0, 0, "emb _weight")
    out = ts.nn.functional.parallel_embedding(ids, emb.weight, None, None, 2.0, False, False, vocab, 0)
    close(out, y, **_tol(), what="functional embedding positional")
    raises(ValueError, ts.nn.ParallelEmbedding, vocab, hidden, _weight=torch.zeros(3, 3), match="_weight")


def check_cross_entropy(p: int, r: int) -> None:
    """tests/test_cross_entropy.py (logits scaled by 1000, scattered with ts.distributed.scatter)
    for every reduction, plus the legacy positional / size_average / reduce arguments."""
    b, s, vpp, scale, seed = 13, 17, 11, 1000.0, 1234
    vocab = vpp * p

    def run(parallel: bool, red: str) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(seed)
        ident = IdentityLayer((b, s, vocab), scale=scale)
        target = torch.LongTensor(size=(b, s)).random_(0, vocab).view(-1)
        logits = ident().view(-1, vocab)
        if parallel:
            lp = ts.distributed.scatter(logits, dim=-1)
            assert ts.get_parallel_dim(lp) == -1
            loss = ts.nn.functional.parallel_cross_entropy(lp, target, reduction=red)
        else:
            loss = F.cross_entropy(logits, target, reduction=red)
        if red == "none":
            assert tuple(loss.shape) == (b * s,)
            loss = loss.sum()
        loss.backward()
        assert ident.weight.grad is not None
        return loss.detach(), ident.weight.grad

    for red in ("none", "mean", "sum"):
        l_ref, g_ref = run(False, red)
        l_ts, g_ts = run(True, red)
        # TorchShard's test runs reduction "none" (summed); "mean" / "sum" reduce 221 losses of
        # ~1e3 in another order than F.cross_entropy: equal to a few float32 ulps, not to 1e-6
        ltol = _tol() if red == "none" or torch.get_default_dtype() != torch.float32 else {"atol": 0.0, "rtol": 5e-7}
        close(l_ts, l_ref, **ltol, what=f"xent loss {red}")
        close(g_ts, g_ref, **_tol(), what=f"xent grad {red}")
    torch.manual_seed(1)
    logits = torch.randn(6, vocab)
    target = torch.randint(0, vocab, (6,))
    xl = ts.distributed.scatter(logits, dim=-1)
    pce = ts.nn.functional.parallel_cross_entropy
    # the legacy arguments (not a TorchShard test): sums of 6 losses, to a few float32 ulps
    tol = {"atol": 1e-6, "rtol": 4e-7} if torch.get_default_dtype() == torch.float32 else TOL
    close(pce(xl, target, None, None, -100, None, "sum"), F.cross_entropy(logits, target, reduction="sum"), **tol)
    close(pce(xl, target, size_average=False), F.cross_entropy(logits, target, reduction="sum"), **tol)
    close(pce(xl, target, reduce=False), F.cross_entropy(logits, target, reduction="none"), **tol)
    crit = ts.nn.ParallelCrossEntropyLoss(size_average=False)
    assert crit.reduction == "sum"
    assert ts.nn.ParallelCrossEntropyLoss(reduce=False).reduction == "none"


class LinearModel(nn.Module):
    def __init__(self, i: int, o: int, bias: bool, dim: int | None) -> None:
        super().__init__()
        self.layer1 = nn.Linear(i, o, bias=bias)
        self.layer2 = ts.nn.ParallelLinear(i, o, bias=bias, dim=dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer1(x), self.layer2(x)


def _init_master(m2: nn.Module, init: Callable[..., Any], **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    ts.nn.init.shard_init_helper_(init, m2.weight, **kw)
    ts.nn.init.shard_init_helper_(nn.init.constant_, m2.bias, val=0.133)
    dim = getattr(m2.weight, ts._PARALLEL_DIM)
    if dim is None:
        return m2.weight.data, m2.bias.data
    if dim == 0:
        return ts.distributed.gather(m2.weight.data, dim=1), m2.bias.data
    return ts.distributed.gather(m2.weight.data, dim=0), ts.distributed.gather(m2.bias.data, dim=0)


def check_nn(p: int, r: int) -> None:
    """tests/test_nn.py: ParallelLinear per dim and the 15-layer hybrid stack (weights from
    shard_init_helper_ with a different seed on every rank), the loss on a column layer's output."""
    batch, feats, seed = 3, 8, 12357
    torch.manual_seed(seed + r)
    x = torch.randn(batch, feats)
    torch.distributed.broadcast(x, 0)
    # shard_init_helper_ broadcasts the full tensor from rank 0: replicated parameters agree too
    torch.manual_seed(seed + r)
    rep = ts.nn.ParallelLinear(feats, feats, dim=None)
    ts.nn.init.shard_init_helper_(nn.init.kaiming_normal_, rep.weight)
    every = [torch.empty_like(rep.weight) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(every, rep.weight.data)
    assert all(torch.equal(w, every[0]) for w in every)
    # LinearModel + ParallelCrossEntropyLoss on the column output, every reduction
    for red in ("none", "mean", "sum"):
        torch.manual_seed(seed + r)
        y = torch.randint(2 * feats, (batch,))
        torch.distributed.broadcast(y, 0)
        model = LinearModel(feats, 2 * feats, True, -1)
        w, bias = _init_master(model.layer2, nn.init.kaiming_normal_, a=0, mode="fan_in", nonlinearity="relu")
        model.layer1.weight.data.copy_(w)
        model.layer1.bias.data.copy_(bias)
        y1, y2 = model(x)
        close(ts.distributed.gather(y2), y1, **_tol(), what="LinearModel fwd")
        loss1 = nn.CrossEntropyLoss(reduction=red)(y1, y)
        loss2 = ts.nn.ParallelCrossEntropyLoss(reduction=red)(y2, y)
        if red == "none":
            loss1, loss2 = loss1.sum(), loss2.sum()
        close(loss2, loss1, **_tol(), what=f"LinearModel loss {red}")
        loss1.backward()
        loss2.backward()
        g2w = ts.distributed.gather(model.layer2.weight.grad, dim=0)
        close(g2w, model.layer1.weight.grad, **_tol(), what="LinearModel dW")
        close(
            ts.distributed.gather(model.layer2.bias.grad, dim=0),
            model.layer1.bias.grad,
            **_tol(),
            what="LinearModel db",
        )
    # LinearStackModel, hybrid2 combination
    dims = [0, 0, 1, None, -1, 0, 0, -1, None, -1, 1, 0, None, 0, -1]
    torch.manual_seed(seed + r)
    m1, m2 = nn.ModuleList(), nn.ModuleList()
    i, j = feats, 2 * feats
    for d in dims:
        m1.append(nn.Linear(i, j))
        m2.append(ts.nn.ParallelLinear(i, j, bias=True, dim=d))
        i, j = j, i
    for a, b in zip(m1, m2, strict=True):
        w, bias = _init_master(b, nn.init.xavier_normal_)
        a.weight.data.copy_(w)
        a.bias.data.copy_(bias)
    y1 = x
    for a in m1:
        y1 = a(y1)
    y2 = x
    for d, b in zip(dims, m2, strict=True):
        y2 = b(y2)
        if hasattr(y2, ts._PARALLEL_DIM) and getattr(y2, ts._PARALLEL_DIM) in [-1, 1]:
            y2 = ts.distributed.gather(y2, dim=d)
            setattr(y2, ts._PARALLEL_DIM, "None")  # as TorchShard's test (its gather tagged the full output)
    close(y2, y1, **_tol(), what="hybrid stack")


def _attention(x: torch.Tensor, mask: torch.Tensor, kqv: nn.Module, proj: nn.Module, n_head: int, par: bool) -> Any:
    bsz, t, c = x.size()
    hs = n_head // ts.distributed.get_group_size() if par else n_head
    y = kqv(x).view(bsz, t, hs, 3 * (c // n_head))
    k, q, v = ts.slice(y, 3, dim=-1, contiguous=True)
    k, q, v = k.transpose(1, 2), q.transpose(1, 2), v.transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(mask[:, :, :t, :t] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(bsz, t, -1)
    if par:
        ts.register_parallel_dim(y, -1)
    return proj(y)


class Attention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, par: bool) -> None:
        super().__init__()
        if par:
            self.kqv: nn.Module = ts.nn.ParallelLinear(n_embd, 3 * n_embd, dim=1)
            self.p: nn.Module = ts.nn.ParallelLinear(n_embd, n_embd, dim=0)
        else:
            self.kqv = nn.Linear(n_embd, 3 * n_embd)
            self.p = nn.Linear(n_embd, n_embd)
        self.n_head, self.par = n_head, par

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> Any:
        return _attention(x, mask, self.kqv, self.p, self.n_head, self.par)


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Identity(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(0.0)
        )

    def forward(self, x: torch.Tensor) -> Any:
        return x + self.mlp(self.ln(x))


def _align(orig: nn.Module, par: nn.Module) -> None:
    for (on, op), (pn, pp) in zip(orig.named_parameters(), par.named_parameters(), strict=True):
        assert on == pn, (on, pn)
        d = ts.get_parallel_dim(pp)
        if d is None:
            pp.data.copy_(op.data)
        elif d == 0:
            pp.data.copy_(ts.distributed.scatter(op.data, dim=-1))
        else:
            pp.data.copy_(ts.distributed.scatter(op.data, dim=0))


def _check_grads(orig: nn.Module, par: nn.Module, what: str, tol: dict[str, float] | None = None) -> None:
    for (on, op), (_, pp) in zip(orig.named_parameters(), par.named_parameters(), strict=True):
        d = ts.get_parallel_dim(pp)
        g = op.grad if d is None else ts.distributed.scatter(op.grad, dim=-1 if d == 0 else 0)
        close(pp.grad, g, **(tol or _tol()), what=f"{what} grad {on}")


def check_modules(p: int, r: int) -> None:
    """tests/test_modules.py: the MLP converted with convert_parallel_linear + RegisterParallelDim,
    and the transformer block (column kqv, head reshape, register_parallel_dim, row projection)."""
    torch.manual_seed(1235 + r)
    bsz, t, hidden = 2, 6, 8
    x = torch.randn(bsz, t, hidden)
    lw = torch.randn(bsz, t, hidden)
    torch.distributed.broadcast(x, 0)
    torch.distributed.broadcast(lw, 0)
    torch.manual_seed(1235)  # the same modules everywhere (TorchShard's test had DDP broadcast them)
    orig, par = MLP(hidden), MLP(hidden)
    par.mlp[0] = ts.nn.ParallelLinear.convert_parallel_linear(par.mlp[0], dim=1)
    par.mlp[2] = ts.nn.RegisterParallelDim(dim=-1)
    par.mlp[3] = ts.nn.ParallelLinear.convert_parallel_linear(par.mlp[3], dim=0)
    assert isinstance(par.mlp[0], ts.nn.ParallelLinear) and par.mlp[0].dim == 1
    _align(orig, par)
    yo, yp = orig(x), par(x)
    close(yp, yo, **_tol(), what="mlp fwd")
    (yo * lw).sum().backward()
    (yp * lw).sum().backward()
    _check_grads(orig, par, "mlp")
    # transformer block
    heads = 2 * p
    hidden = 4 * heads
    x = torch.randn(bsz * p, t, hidden)
    mask = torch.randn(bsz * p, 1, 1, t)
    target = torch.randint(10, (bsz * p,))
    for tsr in (x, mask, target):
        torch.distributed.broadcast(tsr, 0)
    torch.manual_seed(1236)
    ob = nn.ModuleList([Attention(hidden, heads, False), MLP(hidden)])
    pb = nn.ModuleList([Attention(hidden, heads, True), MLP(hidden)])
    pb[1].mlp[0] = ts.nn.ParallelLinear.convert_parallel_linear(pb[1].mlp[0], dim=-1)
    pb[1].mlp[2] = ts.nn.RegisterParallelDim(-1)
    pb[1].mlp[3] = ts.nn.ParallelLinear.convert_parallel_linear(pb[1].mlp[3], dim=0)
    _align(ob, pb)
    yo = ob[1](ob[0](x, mask))
    yp = pb[1](pb[0](x, mask))
    close(yp, yo, **_tol(), what="block fwd")
    lo = nn.CrossEntropyLoss(reduction="sum")(yo.view(bsz * p, -1), target)
    lp = ts.nn.ParallelCrossEntropyLoss(reduction="sum")(yp.view(bsz * p, -1), target)
    # a summed loss of ~30: float32 rounding of the two association orders (row-parallel partial
    # sums all-reduced) differs by a few ulps (4e-6), above an absolute 1e-6
    close(lp, lo, **_loose(), what="block loss")
    lo.backward()
    lp.backward()
    _check_grads(ob, pb, "block", _loose())


class ConvLinearModel(nn.Module):
    def __init__(self, i: int, o: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(i, o, kernel_size=1)
        self.fc = nn.Linear(o, o)

    def forward(self, x: torch.Tensor) -> Any:
        return self.fc(torch.flatten(self.conv(x), 1))


def check_serialization(p: int, r: int) -> None:
    """tests/test_serialization.py: convert_parallel_linear in place (return value ignored), the
    collected state dict equals the plain model's (keys, order, types, values), relocate + load."""
    for dim in (-1, 0, None):
        torch.manual_seed(12357)
        plain = ConvLinearModel(8, 16)
        raw = ConvLinearModel(8, 16)
        ts.nn.ParallelLinear.convert_parallel_linear(raw, dim=dim)
        assert isinstance(raw.fc, ts.nn.ParallelLinear)
        _align(plain, raw)
        sd = ts.collect_state_dict(raw, raw.state_dict())
        ref = plain.state_dict()
        assert list(sd) == list(ref)
        for k in sd:
            assert type(sd[k]) is type(ref[k]), k
            close(sd[k], ref[k], 0, 0, f"collect {dim} {k}")
        fresh = ConvLinearModel(8, 16)
        ts.nn.ParallelLinear.convert_parallel_linear(fresh, dim=dim)
        fresh.load_state_dict(ts.relocate_state_dict(fresh, sd))
        for (k, a), (_, b) in zip(fresh.state_dict().items(), raw.state_dict().items(), strict=True):
            close(a, b, 0, 0, f"relocate {dim} {k}")


class TemplateLayer(nn.Module):
    """projects/templates/ts_layer.py: a custom layer built the TorchShard way (full tensors
    scattered with ts.distributed.scatter, the bias of dim=0 tagged 0 although replicated)."""

    def __init__(self, i: int, o: int, dim: int | None) -> None:
        super().__init__()
        self.dim = dim
        w, b = torch.empty(o, i), torch.empty(o)
        nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        nn.init.uniform_(b, -1 / math.sqrt(i), 1 / math.sqrt(i))
        self.full_w, self.full_b = w.clone(), b.clone()
        if dim in (-1, 1):
            w, b = ts.distributed.scatter(w, dim=0), ts.distributed.scatter(b, dim=0)
        elif dim == 0:
            w = ts.distributed.scatter(w, dim=1)
        self.weight, self.bias = nn.Parameter(w), nn.Parameter(b)
        ts.register_parallel_attribute(self.weight, dim, order_type=0)
        ts.register_parallel_attribute(self.bias, dim, order_type=0)

    def forward(self, x: torch.Tensor) -> Any:
        return ts.nn.functional.parallel_linear(x, self.weight, self.bias, self.dim)


def check_custom_layers(p: int, r: int) -> None:
    """Custom layers tagged with register_parallel_attribute: collect / relocate / DDP ignore list /
    shard_init_helper_ follow TorchShard's rules (order type 0 [out, in], 1 [in, out]; a 1-D
    tensor tagged 0 with order type 0 is a replicated row bias)."""
    for dim in (-1, 0):
        torch.manual_seed(5)
        m = TemplateLayer(4 * p, 3 * p, dim)
        sd = ts.collect_state_dict(m, m.state_dict())
        close(sd["weight"], m.full_w, 0, 0, f"template collect w {dim}")
        close(sd["bias"], m.full_b, 0, 0, f"template collect b {dim}")
        rel = ts.relocate_state_dict(m, sd)
        close(rel["weight"], m.weight, 0, 0, "template relocate w")
        close(rel["bias"], m.bias, 0, 0, "template relocate b")
        names = ts.register_ddp_parameters_to_ignore(m)
        assert names == (["weight", "bias"] if dim == -1 else ["weight"]), names
        x = torch.randn(2, 4 * p)
        torch.distributed.broadcast(x, 0)
        y = m(x)
        y = ts.distributed.gather(y, dim=-1) if dim == -1 else y
        close(y, F.linear(x, m.full_w, m.full_b), **TOL, what=f"template fwd {dim}")
        if dim == 0:  # the replicated bias keeps its shape and is equal everywhere
            torch.manual_seed(r)
            ts.nn.init.shard_init_helper_(nn.init.uniform_, m.bias)
            every = [torch.empty_like(m.bias) for _ in range(torch.distributed.get_world_size())]
            torch.distributed.all_gather(every, m.bias.data)
            assert all(torch.equal(e, every[0]) for e in every)
    # order type 1 ([in, out], like an embedding table) tagged -1: split along the last axis
    full = torch.arange(12.0 * p).reshape(3, 4 * p)
    t = nn.Parameter(ts.distributed.scatter(full, dim=-1).clone())
    ts.register_parallel_attribute(t, -1, 1)
    holder = nn.Module()
    holder.t = t
    close(ts.collect_state_dict(holder, holder.state_dict())["t"], full, 0, 0, "order 1 collect")


class TSConvLinearModel(nn.Module):
    """tests/testing.py's ConvLinearModel: a column-parallel fc gathers the batch first."""

    def __init__(self, i: int, o: int, bias: bool, dim: int | None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(i, o, kernel_size=1, bias=bias)
        self.fc = nn.Linear(o, o, bias=bias)

    def forward(self, x: torch.Tensor) -> Any:
        x = torch.flatten(self.conv(x), 1)
        if isinstance(self.fc, ts.nn.ParallelLinear) and self.fc.dim in (-1, 1):
            x = ts.distributed.gather(x, dim=0)
        return self.fc(x)


def _ts_equal(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """tests/testing.py's assertEqual at its threshold (1e-6, absolute)."""
    close(a, b, TS_THRESHOLD, 0.0, what)


def _ddp_case(dim: int | None, red: str, r: int) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    batch, feats, seed = 3, 8, 12357
    torch.manual_seed(seed + r)
    x = torch.randn(batch, 8, 1, 1)
    y = torch.randint(10, (batch,))
    raw_model = TSConvLinearModel(feats, feats * 2, True, dim)
    ts.nn.ParallelLinear.convert_parallel_linear(raw_model, dim=dim)  # in place, as TorchShard's test
    raw_model = DDP(raw_model)
    ddp_model = DDP(TSConvLinearModel(feats, feats * 2, True, dim))
    raw_criterion = ts.nn.ParallelCrossEntropyLoss(reduction=red)
    ddp_criterion = nn.CrossEntropyLoss(reduction=red)
    rm, dm = raw_model.module, ddp_model.module
    rm.conv.weight.data.copy_(dm.conv.weight.data)
    rm.conv.bias.data.copy_(dm.conv.bias.data)
    if dim is None:
        rm.fc.weight.data.copy_(dm.fc.weight.data)
        rm.fc.bias.data.copy_(dm.fc.bias.data)
    elif dim == 0:
        rm.fc.weight.data.copy_(ts.distributed.scatter(dm.fc.weight.data, dim=1))
        rm.fc.bias.data.copy_(dm.fc.bias.data)
        _ts_equal(ts.distributed.gather(rm.fc.weight.data, dim=1), dm.fc.weight.data, "ddp row fc.weight")
        x = ts.distributed.gather(x, dim=0)
        y = ts.distributed.gather(y, dim=0)
    else:
        rm.fc.weight.data.copy_(ts.distributed.scatter(dm.fc.weight.data, dim=0))
        rm.fc.bias.data.copy_(ts.distributed.scatter(dm.fc.bias.data, dim=0))
        _ts_equal(ts.distributed.gather(rm.fc.weight.data, dim=0), dm.fc.weight.data, "ddp col fc.weight")
        _ts_equal(ts.distributed.gather(rm.fc.bias.data, dim=0), dm.fc.bias.data, "ddp col fc.bias")
    raw_model.train()
    ddp_model.train()
    y1, y2 = raw_model(x), ddp_model(x)
    if dim in (-1, 1):
        _ts_equal(ts.distributed.gather(y1, dim=1), ts.distributed.gather(y2, dim=0), f"ddp col fwd {red}")
        raw_loss, ddp_loss = raw_criterion(y1, ts.distributed.gather(y)), ddp_criterion(y2, y)
    else:
        _ts_equal(y1, y2, f"ddp {dim} fwd {red}")
        raw_loss, ddp_loss = raw_criterion(y1, y), ddp_criterion(y2, y)
        if dim is None:
            _ts_equal(raw_loss, ddp_loss, f"ddp loss {red}")
    if red == "none":
        raw_loss, ddp_loss = raw_loss.sum(), ddp_loss.sum()
    if dim == 0:
        _ts_equal(raw_loss, ddp_loss, f"ddp row loss {red}")
    raw_loss.backward()
    ddp_loss.backward()
    if dim is None:
        for name in ("fc.weight", "fc.bias", "conv.weight", "conv.bias"):
            _ts_equal(rm.get_parameter(name).grad, dm.get_parameter(name).grad, f"ddp {name} {red}")
    elif dim == 0:
        _ts_equal(ts.distributed.gather(rm.fc.weight.grad, dim=-1), dm.fc.weight.grad, f"ddp row fc.weight {red}")
        for name in ("fc.bias", "conv.weight", "conv.bias"):
            _ts_equal(rm.get_parameter(name).grad, dm.get_parameter(name).grad, f"ddp row {name} {red}")
    else:
        wg, bg = dm.fc.weight.grad, dm.fc.bias.grad
        if red != "mean":
            wg, bg = ts.distributed.reduce(wg), ts.distributed.reduce(bg)
        _ts_equal(rm.fc.weight.grad, ts.distributed.scatter(wg, dim=0), f"ddp col fc.weight {red}")
        _ts_equal(rm.fc.bias.grad, ts.distributed.scatter(bg, dim=0), f"ddp col fc.bias {red}")
        cw, cb = rm.conv.weight.grad, rm.conv.bias.grad
        if red == "mean":
            cw, cb = ts.distributed.reduce(cw), ts.distributed.reduce(cb)
        _ts_equal(cw, dm.conv.weight.grad, f"ddp col conv.weight {red}")
        _ts_equal(cb, dm.conv.bias.grad, f"ddp col conv.bias {red}")


def check_ddp(p: int, r: int) -> None:
    """tests/test_nn.py's ``*_within_ddp_mode`` tests (plain, row parallel, column parallel):
    ``convert_parallel_linear`` then ``DistributedDataParallel(model)`` over the whole world, as
    TorchShard's tests and README do; only meaningful when the tensor-parallel group is the world."""
    if p != torch.distributed.get_world_size():
        return
    for dim in (None, 0, -1):
        for red in ("none", "mean", "sum"):
            _ddp_case(dim, red, r)


def checks(p: int, r: int) -> None:
    """All TorchShard-compatibility checks: TorchShard's own tests at their precision (float32,
    its threshold 1e-6), the seed's examples and the serialization checks in float64 (1e-10 or exact)."""
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float32)
        check_layers(p, r)
        check_cross_entropy(p, r)
        check_nn(p, r)
        check_modules(p, r)
        check_ddp(p, r)
        torch.set_default_dtype(torch.float64)
        check_seed_examples(p, r)
        check_serialization(p, r)
        check_custom_layers(p, r)
    finally:
        torch.set_default_dtype(old)
