"""Server-side optimizers and pooled bags on one rank, against torch.optim and torch.nn.EmbeddingBag.

The optimizer steps follow torch's vectorised CPU kernels (fused multiply-adds
where those kernels fuse); torch's CPU square root is not correctly rounded
(MKL), kvps's is, so the references run with a correctly rounded ``sqrt``
patched in and must then agree bit for bit; against unpatched torch they agree
to float precision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

import kvps
from kvps import optim
from kvps.torch import EmbeddingBagConfig, PSEmbedding, PSEmbeddingBag, PSEmbeddingBagCollection, table_lengths

# torch fuses these kernels' multiply-adds on its vectorised (AVX2/AVX-512)
# paths; elsewhere the references can differ in the last bit
FUSED = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@contextlib.contextmanager
def rounded_sqrt() -> Iterator[None]:
    """torch.Tensor.sqrt correctly rounded (numpy's), for bit-exact references."""
    orig = torch.Tensor.sqrt
    torch.Tensor.sqrt = lambda t: torch.from_numpy(np.sqrt(t.detach().numpy()))  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.sqrt = orig  # type: ignore[method-assign]


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    if FUSED:
        assert torch.equal(a, b), (a - b).abs().max()
    else:
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def served(s: kvps.Server) -> int:
    st = s.stats()
    return st["local"] + st["shared"] + st["remote"]


def server(num_keys: int, lengths: Any, opt: Any, dtype: torch.dtype = torch.float32) -> kvps.Server:
    kvps.setup(num_keys, 1, "all")
    return kvps.Server(lengths, optimizer=opt, dtype=dtype)


CASES: list[tuple[Any, Callable[[Any], torch.optim.Optimizer]]] = [
    (optim.SGD(lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    (optim.Adagrad(lr=0.1), lambda p: torch.optim.Adagrad(p, lr=0.1)),
    (optim.Adagrad(lr=0.05, eps=1e-6), lambda p: torch.optim.Adagrad(p, lr=0.05, eps=1e-6)),
    (optim.Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    (
        optim.Adam(lr=0.02, betas=(0.6, 0.9), eps=1e-6),
        lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.6, 0.9), eps=1e-6),
    ),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("opt", "ref"), CASES, ids=lambda c: getattr(c, "name", ""))
def test_optimizer_matches_torch_optim(
    opt: Any, ref: Callable[[Any], torch.optim.Optimizer], dtype: torch.dtype
) -> None:
    """Every push is one torch.optim step on the rows (all rows get a gradient each step)."""
    n, d = 48, 32
    g = torch.Generator().manual_seed(1)
    w0 = torch.randn(n, d, generator=g, dtype=dtype)
    s = server(n, d, opt, dtype)
    w = kvps.Worker(0, s)
    keys = torch.arange(n)
    w.set(keys, w0.reshape(-1).clone())
    p = torch.nn.Parameter(w0.clone())
    p_plain = torch.nn.Parameter(w0.clone())
    o, o_plain = ref([p]), ref([p_plain])
    for _ in range(6):
        grad = torch.randn(n, d, generator=g, dtype=dtype)
        w.push(keys, grad.reshape(-1).clone())
        p.grad, p_plain.grad = grad.clone(), grad.clone()
        with rounded_sqrt():
            o.step()
        o_plain.step()
    out = torch.empty(n * d, dtype=dtype)
    w.pull(keys, out)
    same(out.view(n, d), p.detach())
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out.view(n, d), p_plain.detach(), rtol=tol, atol=tol)
    s.shutdown()


def test_rowwise_adagrad_closed_form() -> None:
    """One accumulator per row: acc += mean(g^2); p -= lr * g / (sqrt(acc) + eps)."""
    n, d, lr, eps = 10, 8, 0.3, 1e-8
    s = server(n, d, optim.RowWiseAdagrad(lr=lr, eps=eps), torch.float64)
    w = kvps.Worker(0, s)
    keys = torch.arange(n)
    p = torch.randn(n, d, dtype=torch.float64)
    w.set(keys, p.reshape(-1).clone())
    acc = torch.zeros(n, 1, dtype=torch.float64)
    for _ in range(4):
        grad = torch.randn(n, d, dtype=torch.float64)
        w.push(keys, grad.reshape(-1).clone())
        acc += (grad * grad).mean(1, keepdim=True)
        p -= lr * grad / (acc.sqrt() + eps)
    out = torch.empty(n * d, dtype=torch.float64)
    w.pull(keys, out)
    torch.testing.assert_close(out.view(n, d), p, rtol=1e-13, atol=1e-13)
    assert np.array_equal(s._shard.slot_lengths, np.full(n, d + 1))  # the state: one accumulator per row
    s.shutdown()


def test_adam_counts_steps_per_row() -> None:
    """A row pushed at steps 1 and 3 takes Adam's bias corrections of steps 1 and 2 (TorchRec's semantics)."""
    d = 16
    s = server(2, d, optim.Adam(lr=0.1))
    w = kvps.Worker(0, s)
    w.set(torch.arange(2), torch.zeros(2 * d))
    g = [torch.randn(d) for _ in range(3)]
    w.push(torch.tensor([0]), g[0].clone())
    w.push(torch.tensor([1]), g[1].clone())
    w.push(torch.tensor([0]), g[2].clone())
    p = torch.nn.Parameter(torch.zeros(d))
    o = torch.optim.Adam([p], lr=0.1)
    for gi in (g[0], g[2]):
        p.grad = gi.clone()
        with rounded_sqrt():
            o.step()
    out = torch.empty(d)
    w.pull(torch.tensor([0]), out)
    same(out, p.detach())
    s.shutdown()


def _dense_copy(bag: PSEmbeddingBag, mode: str, pad: int | None) -> torch.nn.EmbeddingBag:
    dense = torch.nn.EmbeddingBag(bag.num_embeddings, bag.embedding_dim, mode=mode, padding_idx=pad)
    with torch.no_grad():
        dense.weight.copy_(bag.pull_rows(torch.arange(bag.num_embeddings)))
    return dense


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("pad", [None, 3, -1])
def test_bag_matches_nn_embedding_bag(mode: str, pad: int | None) -> None:
    """Forward values and the rows after each optimizer step equal nn.EmbeddingBag + torch.optim."""
    n, d, off = 50, 16, 5
    for opt, ref in CASES[:2]:
        kvps.setup(n + off, 1, "none")
        s = kvps.Server(d, optimizer=opt)
        w = kvps.Worker(0, s)
        bag = PSEmbeddingBag(n, d, w, mode, off, padding_idx=pad, seed=3)
        dense = _dense_copy(bag, mode, pad)
        if pad is not None:
            assert torch.equal(dense.weight[pad], torch.zeros(d))  # the padding row starts at 0
        o = ref(dense.parameters())
        g = torch.Generator().manual_seed(7)
        for _ in range(3):
            ids = torch.randint(0, n, (60,), generator=g)
            if pad is not None:
                ids[::5] = pad % n
            offsets = torch.tensor([0, 10, 10, 25, 40])  # an empty bag too
            psw = torch.randn(60, generator=g) if mode == "sum" else None
            a, b = bag(ids, offsets, psw), dense(ids, offsets, psw)
            assert torch.equal(a, b)
            gout = torch.randn(a.shape, generator=g)
            a.backward(gout)
            b.backward(gout)
            bag.flush()
            with rounded_sqrt():
                o.step()
            o.zero_grad()
            same(bag.pull_rows(torch.arange(n)), dense.weight.detach())
        x = torch.randint(0, n, (4, 6), generator=g, dtype=torch.int32)  # fixed-length bags, int32 ids
        with torch.no_grad():
            assert torch.equal(bag(x), dense(x))
        last = torch.tensor([0, 7, 20])  # include_last_offset
        bag.include_last_offset = True
        dense.include_last_offset = True
        with torch.no_grad():
            assert torch.equal(bag(ids[:20], last), dense(ids[:20], last))
        # with 2-D input torch ignores include_last_offset (B bags): the same bags, the same steps
        cases = (
            (torch.randint(0, n, (3, 4), generator=g), None),
            (ids[:20], last),
            (torch.empty(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)),  # no bags
        )
        for x, offs in cases:
            a, b = bag(x, offs), dense(x, offs)
            assert torch.equal(a, b), x.shape
            gout = torch.randn(a.shape, generator=g)
            (a * gout).sum().backward()
            (b * gout).sum().backward()
            bag.flush()
            with rounded_sqrt():
                o.step()
            o.zero_grad()
            same(bag.pull_rows(torch.arange(n)), dense.weight.detach())
        bag.include_last_offset = dense.include_last_offset = False
        empty = torch.empty(0, dtype=torch.int64)  # no bags at all: (0, dim), as torch
        assert bag(empty, empty).shape == dense(empty, empty).shape == (0, d)
        s.shutdown()


NO_RULE = (
    r"backward would push gradients, but the kvps server has no update rule.*optimizer=kvps\.optim\..*torch\.no_grad"
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_bags_without_update_rule_serve_lookups(dtype: torch.dtype) -> None:
    """A server without optimizer: forward equals nn.EmbeddingBag in every grad mode; backward raises, pushing nothing."""
    n, d = 40, 8
    tables = [EmbeddingBagConfig("a", 10, 8, ["fa", "fb"], mode="mean"), EmbeddingBagConfig("b", 30, 4, mode="max")]
    kvps.setup(n + 40, 1, "none")
    s = kvps.Server(np.concatenate([np.full(n, d), table_lengths(tables)]), dtype=dtype)  # no optimizer
    w = kvps.Worker(0, s)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, n, (30,), generator=g)
    offs = torch.tensor([0, 5, 5, 17])
    for mode in ("sum", "mean", "max"):
        bag = PSEmbeddingBag(n, d, w, mode, seed=4, padding_idx=2 if mode == "mean" else None)
        dense = torch.nn.EmbeddingBag(n, d, mode=mode, padding_idx=bag.padding_idx, dtype=dtype)
        with torch.no_grad():
            dense.weight.copy_(bag.pull_rows(torch.arange(n)))
        rows = dense.weight.detach().clone()
        psw = torch.randn(30, generator=g).to(dtype) if mode == "sum" else None
        ref = dense(ids, offs, psw)
        with torch.no_grad():
            assert torch.equal(bag(ids, offs, psw), ref)
        with torch.inference_mode():
            assert torch.equal(bag(ids, offs, psw), ref)
        out = bag(ids, offs, psw)  # grad mode (evaluation without no_grad): the same numbers
        assert torch.equal(out.detach(), ref)
        before = served(s)
        with pytest.raises(RuntimeError, match="PSEmbeddingBag: " + NO_RULE):
            out.sum().backward()
        bag.flush()
        assert served(s) == before  # nothing pushed
        assert torch.equal(bag.pull_rows(torch.arange(n)), rows)  # the server state is untouched
    col = PSEmbeddingBagCollection(tables, w, key_offset=n, seed=5)
    feats = {
        "fa": (torch.tensor([1, 2, 2, 9]), torch.tensor([0, 1])),
        "fb": (torch.tensor([0, 9]), torch.tensor([0])),
        "b": (torch.tensor([3, 29, 3, 0, 7]), torch.tensor([0, 2, 2])),
    }
    buf = torch.empty(10 * 8 + 30 * 4, dtype=dtype)
    w.pull(torch.arange(n, n + 40), buf)
    wa, wb = buf[:80].view(10, 8), buf[80:].view(30, 4)
    ref = {
        "fa": torch.nn.functional.embedding_bag(feats["fa"][0], wa, feats["fa"][1], mode="mean"),
        "fb": torch.nn.functional.embedding_bag(feats["fb"][0], wa, feats["fb"][1], mode="mean"),
        "b": torch.nn.functional.embedding_bag(feats["b"][0], wb, feats["b"][1], mode="max"),
    }
    with torch.no_grad():
        got = col(feats)
    assert list(got) == ["fa", "fb", "b"] and all(torch.equal(got[f], ref[f]) for f in ref)
    got = col(feats)
    assert all(torch.equal(got[f].detach(), ref[f]) for f in ref)
    before = served(s)
    with pytest.raises(RuntimeError, match="PSEmbeddingBagCollection: " + NO_RULE):
        sum(v.sum() for v in got.values()).backward()
    col.flush()
    after = torch.empty_like(buf)
    w.pull(torch.arange(n, n + 40), after)
    assert served(s) - before == 40 and torch.equal(after, buf)  # (the 40 pulled just now): nothing pushed
    s.shutdown()


def test_psembedding_rule_is_its_own() -> None:
    """PSEmbedding: forward = the stored rows on any server; its worker-side Adagrad trains on a server without
    optimizer and refuses (at backward, pushing nothing) one whose optimizer would take the deltas as gradients."""
    n, d, lr = 12, 3, 0.5
    ids = torch.tensor([[1, 4, 4], [7, 1, 0]])
    kvps.setup(n, 1, "none")
    s = kvps.Server(2 * d, optimizer=optim.SGD(lr=1.0))
    w = kvps.Worker(0, s)
    emb = PSEmbedding(n, d, w, lr=lr, seed=3)
    rows, acc = emb.pull_rows(torch.arange(n))
    assert torch.equal(acc, torch.zeros(n, d))
    with torch.no_grad():
        assert torch.equal(emb(ids), torch.nn.functional.embedding(ids, rows))
    out = emb(ids)
    assert torch.equal(out.detach(), torch.nn.functional.embedding(ids, rows))
    before = served(s)
    with pytest.raises(RuntimeError, match=r"PSEmbedding: .*update rule \(SGD\).*server without optimizer"):
        out.sum().backward()
    emb.flush()
    assert served(s) == before
    r2, a2 = emb.pull_rows(torch.arange(n))
    assert torch.equal(r2, rows) and torch.equal(a2, acc)
    s.shutdown()
    # no update rule on the server: the module's Adagrad, one step from acc = 0 moves each row by -lr * sign(g)
    s = kvps.Server(2 * d)
    w = kvps.Worker(0, s)
    emb = PSEmbedding(n, d, w, lr=lr, seed=3)
    assert torch.equal(emb.pull_rows(torch.arange(n))[0], rows)  # the same seeded rows
    emb(ids).sum().backward()
    emb.flush()
    r2, a2 = emb.pull_rows(torch.arange(n))
    counts = torch.bincount(ids.reshape(-1), minlength=n).float()[:, None].expand(n, d)
    torch.testing.assert_close(r2, rows - lr * (counts > 0).float(), rtol=0, atol=1e-6)
    assert torch.equal(a2, counts**2)
    s.shutdown()


def test_bag_pulls_and_pushes_each_distinct_key_once() -> None:
    kvps.setup(100, 1, "none")
    s = kvps.Server(4, optimizer=optim.SGD(lr=0.5))
    w = kvps.Worker(0, s)
    bag = PSEmbeddingBag(100, 4, w, "sum", initialize=False)
    ids = torch.tensor([5, 5, 7, 9, 5, 7, 9, 9])
    before = served(s)
    out = bag(ids, torch.tensor([0, 3, 6]))
    assert served(s) - before == 3  # one pull of keys 5, 7, 9
    out.sum().backward()
    bag.flush()
    assert served(s) - before == 6  # and one push of one summed gradient each
    rows = bag.pull_rows(torch.tensor([5, 7, 9]))
    assert torch.equal(rows, -0.5 * torch.tensor([3.0, 2.0, 3.0])[:, None].expand(3, 4))
    s.shutdown()


def test_collection_matches_per_table_bags() -> None:
    """Three tables (two features sharing one), dict inputs with offsets or lengths, KJT-like input, Adam per row."""
    tables = [
        EmbeddingBagConfig("t0", 30, 8, ["f0", "f1"], mode="sum", padding_idx=2),
        EmbeddingBagConfig("t1", 20, 8, mode="mean"),
        EmbeddingBagConfig("t2", 10, 4, mode="max"),
    ]
    lens = table_lengths(tables)
    assert lens.tolist() == [8] * 50 + [4] * 10
    kvps.setup(len(lens) + 7, 1, "all")
    s = kvps.Server(np.concatenate([np.full(7, 3), lens]), optimizer=optim.Adam(lr=0.01))
    w = kvps.Worker(0, s)
    col = PSEmbeddingBagCollection(tables, w, key_offset=7, seed=11)
    assert col.feature_names == ["f0", "f1", "t1", "t2"]
    base = [7, 37, 57]
    dense = {}
    for i, t in enumerate(tables):
        buf = torch.empty(t.num_embeddings * t.embedding_dim)
        w.pull(torch.arange(t.num_embeddings) + base[i], buf)
        dense[t.name] = torch.nn.EmbeddingBag(t.num_embeddings, t.embedding_dim, mode=t.mode, padding_idx=t.padding_idx)
        with torch.no_grad():
            dense[t.name].weight.copy_(buf.view(t.num_embeddings, -1))
    g = torch.Generator().manual_seed(2)
    f0 = torch.randint(0, 30, (12,), generator=g)
    f0[::4] = 2  # the padding id
    feats = {
        "f0": (f0, torch.tensor([0, 4, 8])),
        "f1": {"values": torch.randint(0, 30, (9,), generator=g), "lengths": torch.tensor([2, 3, 4])},
        "t1": (torch.randint(0, 20, (7,), generator=g), torch.tensor([0, 3, 5])),
        "t2": {"values": torch.randint(0, 10, (6,), generator=g), "offsets": torch.tensor([0, 1, 2])},
    }
    out = col(feats)
    ref = {
        "f0": dense["t0"](*feats["f0"]),
        "f1": dense["t0"](feats["f1"]["values"], torch.tensor([0, 2, 5])),
        "t1": dense["t1"](*feats["t1"]),
        "t2": dense["t2"](feats["t2"]["values"], feats["t2"]["offsets"]),
    }
    assert list(out) == list(ref)
    for k in out:
        assert torch.equal(out[k], ref[k]), k
    before = served(s)
    sum((v * (i + 1)).sum() for i, v in enumerate(out.values())).backward()
    col.flush()
    pushed = served(s) - before
    assert pushed == int(col.keys(feats).numel()) - 1  # one gradient per distinct key but the padding key
    sum((v * (i + 1)).sum() for i, v in enumerate(ref.values())).backward()
    keys = col.keys(feats)
    for i, t in enumerate(tables):
        grad = dense[t.name].weight.grad
        p0 = dense[t.name].weight.detach()
        buf = torch.empty(t.num_embeddings * t.embedding_dim)
        w.pull(torch.arange(t.num_embeddings) + base[i], buf)
        got = buf.view(t.num_embeddings, -1)
        for r in range(t.num_embeddings):
            in_batch = bool((keys == base[i] + r).any()) and r != t.padding_idx
            if not in_batch:
                assert torch.equal(got[r], p0[r]), (t.name, r)
                continue
            pr = torch.nn.Parameter(p0[r].clone())
            o = torch.optim.Adam([pr], lr=0.01)
            pr.grad = grad[r].clone()
            with rounded_sqrt():
                o.step()
            same(got[r], pr.detach())

    class KJT:  # the public methods of TorchRec's KeyedJaggedTensor that kvps reads
        def keys(self) -> list[str]:
            return ["f0", "f1", "t1", "t2"]

        def values(self) -> torch.Tensor:
            return torch.cat([feats["f0"][0], feats["f1"]["values"], feats["t1"][0], feats["t2"]["values"]])

        def lengths(self) -> torch.Tensor:
            return torch.tensor([4, 4, 4, 2, 3, 4, 3, 2, 2, 1, 1, 4])

        def weights_or_none(self) -> None:
            return None

    with torch.no_grad():
        a, b = col(KJT()), col(feats)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # a feature without bags in this batch: (0, dim), whether given by lengths or offsets
    e = torch.empty(0, dtype=torch.int64)
    with torch.no_grad():
        out = col({**feats, "f1": {"values": e, "lengths": e}, "t2": (e, e)})
    assert out["f1"].shape == (0, 8) and out["t2"].shape == (0, 4)
    s.shutdown()


def test_bad_input() -> None:
    """Optimizers, bags and collections refuse bad arguments with clear errors before anything is sent."""
    for bad, exc in (({"lr": -1.0}, ValueError), ({"lr": "x"}, TypeError), ({"lr": float("nan")}, ValueError)):
        with pytest.raises(exc, match="lr"):
            optim.SGD(**bad)
    with pytest.raises(ValueError, match="eps"):
        optim.Adagrad(eps=-1)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        optim.Adam(betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="betas"):
        optim.Adam(betas=0.9)  # type: ignore[arg-type]
    kvps.setup(20, 1, "none")
    with pytest.raises(TypeError, match="optimizer must be"):
        kvps.Server(4, optimizer="adam")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="float32 or float64"):
        kvps.Server(4, optimizer=optim.SGD(), dtype=torch.bfloat16)
    s = kvps.Server(4, optimizer=optim.SGD())
    w = kvps.Worker(0, s)
    with pytest.raises(ValueError, match="value length 4, the table needs embedding_dim = 5"):
        PSEmbeddingBag(10, 5, w)
    with pytest.raises(ValueError, match="exceed the server's 20 keys"):
        PSEmbeddingBag(10, 4, w, key_offset=15)
    with pytest.raises(ValueError, match="mode"):
        PSEmbeddingBag(10, 4, w, mode="median")
    with pytest.raises(ValueError, match="padding_idx"):
        PSEmbeddingBag(10, 4, w, padding_idx=10)
    with pytest.raises(TypeError, match="worker"):
        PSEmbeddingBag(10, 4, "w")  # type: ignore[arg-type]
    bag = PSEmbeddingBag(10, 4, w, "mean")
    ids, offs = torch.tensor([1, 2, 3]), torch.tensor([0, 2])
    with pytest.raises(TypeError, match="int64 or int32"):
        bag(ids.float(), offs)
    with pytest.raises(IndexError, match=r"input\[1\] = 10 is out of range \[0, 10\)"):
        bag(torch.tensor([1, 10, 3]), offs)
    with pytest.raises(IndexError, match="negative"):
        bag(torch.tensor([1, -1, 3]), offs)
    with pytest.raises(ValueError, match="offsets are required"):
        bag(ids)
    with pytest.raises(ValueError, match="offsets must be None"):
        bag(ids.view(1, 3), offs)
    with pytest.raises(ValueError, match="start at 0"):
        bag(ids, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="non-decreasing"):
        bag(ids, torch.tensor([0, 2, 1]))
    with pytest.raises(ValueError, match="exceeds"):
        bag(ids, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="1-D"):
        bag(ids.view(1, 1, 3))
    with pytest.raises(ValueError, match="only supported for mode='sum'"):
        bag(ids, offs, torch.ones(3))
    bag_sum = PSEmbeddingBag(10, 4, w, "sum", initialize=False)
    with pytest.raises(TypeError, match="float32"):
        bag_sum(ids, offs, torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="one weight per id"):
        bag_sum(ids, offs, torch.ones(4))
    with pytest.raises(ValueError, match="include_last_offset"):
        PSEmbeddingBag(10, 4, w, "sum", include_last_offset=True, initialize=False)(ids, offs)
    empty = torch.empty(0, dtype=torch.int64)
    with pytest.raises(ValueError, match="at least one offset"):
        PSEmbeddingBag(10, 4, w, "sum", include_last_offset=True, initialize=False)(empty, empty)
    with pytest.raises(ValueError, match="offsets are empty"):  # ids in no bag (torch drops them silently)
        bag(ids, empty)
    with pytest.raises(ValueError, match="max_norm is not supported"):
        PSEmbeddingBag(10, 4, w, max_norm=1.0, initialize=False)
    with pytest.raises(ValueError, match="scale_grad_by_freq"):
        PSEmbeddingBag(10, 4, w, scale_grad_by_freq=True, initialize=False)
    assert PSEmbeddingBag(10, 4, w, sparse=True, initialize=False).sparse  # (accepted: always row-wise)
    with pytest.raises(TypeError, match="name"):
        EmbeddingBagConfig("", 5, 4)
    with pytest.raises(ValueError, match="num_embeddings"):
        EmbeddingBagConfig("t", 0, 4)
    tables = [EmbeddingBagConfig("a", 5, 4), EmbeddingBagConfig("b", 5, 4, ["x", "y"])]
    with pytest.raises(ValueError, match="more than one table"):
        PSEmbeddingBagCollection([*tables, EmbeddingBagConfig("c", 5, 4, ["a"])], w)
    col = PSEmbeddingBagCollection(tables, w)
    good = (torch.tensor([1, 2]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"features \['y'\] are missing"):
        col({"a": good, "x": good})
    with pytest.raises(ValueError, match="unknown features"):
        col({"a": good, "x": good, "y": good, "z": good})
    with pytest.raises(IndexError, match=r"feature 'x'\[0\] = 5 is out of range \[0, 5\)"):
        col({"a": good, "x": (torch.tensor([5]), torch.tensor([0])), "y": good})
    with pytest.raises(ValueError, match="lengths sum to 3"):
        col({"a": good, "x": {"values": torch.tensor([1, 2]), "lengths": torch.tensor([1, 2])}, "y": good})
    with pytest.raises(ValueError, match="one of 'offsets' / 'lengths'"):
        col({"a": good, "x": {"values": torch.tensor([1])}, "y": good})
    with pytest.raises(TypeError, match="must be \\(values, offsets"):
        col({"a": good, "x": torch.tensor([1]), "y": good})
    with pytest.raises(TypeError, match="features must be"):
        col([good])
    s.shutdown()
