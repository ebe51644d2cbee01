"""Spawned bodies of test_gpu.py: the CUDA cross-entropy against the CPU kernel and F.cross_entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import shardlayers as ts
from distkit_common.dtypes import code_of
from distkit_common.testing import init_process_group
from shardlayers import _shardlayers
from shardlayers._xent import acc_dtype, native_grad, native_stats


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


def _grad_into(x: torch.Tensor, g: torch.Tensor, target: torch.Tensor, w: torch.Tensor, coef: torch.Tensor) -> None:
    """The gradient kernel (CUDA or CPU, by x's device) into a given contiguous g (maybe misaligned)."""
    n, c = x.shape
    args = (x.data_ptr(), g.data_ptr(), n, c, x.stride(0), code_of(x.dtype), target.data_ptr(), 0, w.data_ptr())
    if x.is_cuda:
        _shardlayers.xent_grad_cuda(*args, coef.data_ptr(), int(torch.cuda.current_stream().cuda_stream))
    else:
        _shardlayers.xent_grad_cpu(*args, coef.data_ptr())


def vectors_body(rank: int, size: int, store: str) -> None:
    """The 16-byte vector cuts on the GPU: rows starting at every element offset within 16 bytes,
    an odd row stride (every row its own alignment), lengths around the vector width and a long
    odd one, a gradient buffer misaligned against the logits; CUDA against the CPU kernel."""
    dev = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        per16 = 16 // torch.tensor([], dtype=dtype).element_size()
        acc = acc_dtype(dtype)
        for c in (1, 7, 9, 17, 1000, 4099):
            for offset in range(per16):
                n, stride = 6, c + 1
                buf = (torch.randn(n * stride + offset + c, generator=g) * 4).to(dtype)
                buf_d = buf.to(dev)
                x = buf.as_strided((n, c), (stride, 1), offset)
                x_d = buf_d.as_strided((n, c), (stride, 1), offset)
                target = torch.randint(0, c, (n,), generator=g)
                target[2] = -100
                w = torch.rand(c, generator=g, dtype=acc) + 0.5
                ref = native_stats(x, target, 0, w, True)
                got = native_stats(x_d, target.to(dev), 0, w.to(dev), True).cpu()
                where = f"{dtype} c={c} offset={offset}"
                assert torch.equal(got[:, 0], ref[:, 0]) and torch.equal(got[:, 2], ref[:, 2]), where
                torch.testing.assert_close(got[:, 1], ref[:, 1], rtol=1e-5, atol=0, msg=where)
                torch.testing.assert_close(got[:, 3], ref[:, 3], rtol=1e-4, atol=1e-3, msg=where)
                coef = torch.rand(n, 4, generator=g, dtype=acc)
                coef[:, 0] = ref[:, 0]
                coef[2] = 0
                for g_offset in (0, 1):
                    gref = torch.empty(n * c + g_offset, dtype=dtype)[g_offset:].view(n, c)
                    gbuf = torch.full((n * c + g_offset + 8,), float("nan"), dtype=dtype, device=dev)
                    got_g = gbuf[g_offset : g_offset + n * c].view(n, c)
                    _grad_into(x, gref, target, w, coef)
                    _grad_into(x_d, got_g, target.to(dev), w.to(dev), coef.to(dev))
                    assert torch.isnan(gbuf[:g_offset]).all() and torch.isnan(gbuf[g_offset + n * c :]).all(), where
                    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-5)
                    torch.testing.assert_close(got_g.cpu().to(acc), gref.to(acc), rtol=tol, atol=tol, msg=where)
                    assert torch.all(got_g[2] == 0), where
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
