"""Spawned bodies of test_gpu.py: the CUDA cross-entropy against the CPU kernel and F.cross_entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import shardlayers as ts
from distkit_common.testing import init_process_group
from shardlayers._xent import native_grad, native_stats


def kernels_body(rank: int, size: int, store: str) -> None:
    dev = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(0)
    n, c, vstart = 37, 1000, 100
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = (torch.randn(n, c + 3, generator=g) * 4).to(dtype)[:, :c]  # row stride > c
        x[0, :] = float("-inf")  # every local class masked (a padded vocabulary slice)
        x[1, 7::3] = float("-inf")
        x[2, : c - 1] = float("-inf")
        x[3, :] = 200.0 if dtype != torch.float16 else 60000.0  # ignored: exp(x) overflows
        target = torch.randint(vstart, vstart + c, (n,), generator=g)
        target[3] = -100
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        w = torch.rand(c, generator=g, dtype=acc) + 0.5
        ref = native_stats(x, target, vstart, w, True)
        got = native_stats(x.to(dev), target.to(dev), vstart, w.to(dev), True).cpu()
        assert got[0, 0] == float("-inf") and got[0, 1] == 0, got[0]
        assert not torch.isnan(got[:, :3]).any()
        torch.testing.assert_close(got[:, 0], ref[:, 0], rtol=0, atol=0)
        torch.testing.assert_close(got[:, 1:3], ref[:, 1:3], rtol=1e-5, atol=1e-5)
        coef = torch.rand(n, 4, generator=g, dtype=acc)
        coef[:, 0] = ref[:, 0] + torch.log(ref[:, 1])
        coef[0] = 0
        coef[3] = 0
        ref_g = native_grad(x, target, vstart, w, coef)
        got_g = native_grad(x.to(dev), target.to(dev), vstart, w.to(dev), coef.to(dev)).cpu()
        assert not torch.isnan(got_g).any()
        assert torch.all(got_g[[0, 3]] == 0)
        tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-5)
        torch.testing.assert_close(got_g.to(acc), ref_g.to(acc), rtol=tol, atol=tol)
    torch.cuda.synchronize()


def head_body(rank: int, size: int, store: str) -> None:
    init_process_group(rank, size, store)
    ts.distributed.init_process_group(size)
    dev = torch.device("cuda", 0)
    vocab, hidden = 33, 16  # padded to 24 rows per rank: rank 1 holds 16 real rows, rank 0 17
    torch.manual_seed(0)
    ref = torch.nn.Linear(hidden, vocab, bias=False)
    head = ts.nn.ColumnParallelLinear(hidden, vocab, bias=False, gather_output=False, pad_to_multiple_of=24)
    head.load_state_dict(ts.relocate_state_dict(head, ref.state_dict()))
    ref, head = ref.to(dev), head.to(dev)
    x = torch.randn(12, hidden, generator=torch.Generator().manual_seed(1)).to(dev)
    y = torch.randint(0, vocab, (12,), generator=torch.Generator().manual_seed(2)).to(dev)
    y[[2, 5]] = -100
    for smoothing in (0.0, 0.1):
        ref.zero_grad()
        head.zero_grad()
        logits = head(x * 20)  # large logits: exp overflows without the max shift
        assert torch.isinf(logits[:, head.weight.shape[0] - 1]).all()  # padding columns are -inf
        loss = ts.nn.ParallelCrossEntropyLoss(label_smoothing=smoothing)(logits, y)
        loss.backward()
        ref_loss = F.cross_entropy(ref(x * 20), y, label_smoothing=smoothing)
        ref_loss.backward()
        assert torch.isfinite(loss), loss
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        chunk = -(-vocab // size)
        real = min(chunk, vocab - rank * chunk)
        torch.testing.assert_close(head.weight.grad[:real], ref.weight.grad[rank * chunk : rank * chunk + real])
        assert torch.all(head.weight.grad[real:] == 0)
    torch.cuda.synchronize()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
