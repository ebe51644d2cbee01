"""The real CUDA paths of wholemem, on a machine with a GPU (``-m gpu``; ``nox -s gpu``).

Every test runs its body in fresh spawned processes (``run_spawn``), so a CUDA fault
(sticky for the process that hit it) cannot leak into the next test, and several ranks
can share the one GPU of a test machine: CUDA IPC and ``cudaHostRegister`` work between
processes on one device, and the all-to-all of GPU NCCL tensors goes over gloo
(``device_group`` / ``device_backend='gloo'``), since NCCL refuses two ranks on one GPU.
"""

from __future__ import annotations

import gc
import json
from typing import Any

import pytest
import torch

from distkit_common.testing import init_process_group, run_spawn
from wholemem import _wholemem
from wholemem._layout import SUPPORTED_DTYPES

GPU = bool(_wholemem.cuda_compiled() and torch.cuda.is_available() and _wholemem.cuda_device_count() > 0)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and a wholemem build with nvcc (nox -s gpu)"),
]

DTYPES = list(SUPPORTED_DTYPES)


def enc(rows: torch.Tensor, ncols: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Values encoding the row id, exact in every dtype (bool: a pattern of the row)."""
    v = (rows[:, None].cpu() * 3 + torch.arange(ncols)[None, :] * 5 + salt) % 101
    return (v % 2).bool() if dtype == torch.bool else v.to(dtype)


def _comm(rank: int, size: int, store: str, **kw: Any) -> Any:
    """A wholemem communicator over a gloo world group that also carries GPU all-to-alls."""
    import torch.distributed as dist

    import wholemem as wg

    init_process_group(rank, size, store)
    wg.init_lib()
    return wg.communicator_from_process_group(None, device_group=dist.group.WORLD, **kw)


def _close(comm: Any) -> None:
    import torch.distributed as dist

    import wholemem as wg

    comm.destroy()
    wg.finalize_lib()
    dist.barrier()
    dist.destroy_process_group()


# -- native row tables on the device vs the CPU --------------------------------------------


def _table_body(rank: int, size: int, store: str) -> None:
    from distkit_common.dtypes import code_of

    dev = torch.device("cuda", torch.cuda.current_device())
    stream = torch.cuda.current_stream(dev).cuda_stream
    g = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        for rows_per_chunk, row_stride in ((40, 7), (13, 9)):  # one chunk, several; padded rows
            nrows, ncols = 40, 7
            host = [
                enc(torch.arange(c, min(c + rows_per_chunk, nrows)), row_stride, dtype)
                for c in range(0, nrows, rows_per_chunk)
            ]
            gpu = [h.to(dev) for h in host]
            args = (rows_per_chunk, nrows, ncols, row_stride, 1, code_of(dtype))
            t_cpu = _wholemem.Table([int(h.data_ptr()) for h in host], *args)
            t_gpu = _wholemem.Table([int(c.data_ptr()) for c in gpu], *args, True, dev.index)
            for idx_dtype in (torch.int64, torch.int32):
                idx = torch.randint(0, 30, (100,), generator=g, dtype=idx_dtype)
                for window in ({}, {"row0": 5, "nrows": 30, "col0": 2, "ncols": 4}):
                    w = window.get("ncols", ncols)
                    o_cpu = torch.empty(100, w, dtype=dtype)
                    o_gpu = torch.empty(100, w, dtype=dtype, device=dev)
                    d_idx = idx.to(dev)
                    t_cpu.gather(int(idx.data_ptr()), idx_dtype == torch.int64, 100, int(o_cpu.data_ptr()), **window)
                    t_gpu.gather(
                        int(d_idx.data_ptr()), idx_dtype == torch.int64, 100, int(o_gpu.data_ptr()), stream, **window
                    )
                    assert torch.equal(o_gpu.cpu(), o_cpu), (dtype, window)
            # scatter of unique rows, then the tables agree everywhere
            uniq = torch.randperm(nrows, generator=g)[:11]
            vals = enc(uniq + 50, ncols, dtype)
            t_cpu.scatter(int(uniq.data_ptr()), True, 11, int(vals.data_ptr()))
            d_uniq, d_vals = uniq.to(dev), vals.to(dev)
            t_gpu.scatter(int(d_uniq.data_ptr()), True, 11, int(d_vals.data_ptr()), stream)
            torch.cuda.synchronize()
            assert all(torch.equal(c.cpu(), h) for c, h in zip(gpu, host)), dtype
            # a bad index: IndexError naming it, nothing written, the context still usable
            bad = torch.tensor([0, 40, 1], device=dev)
            with pytest.raises(IndexError, match="index 40 at position 1 is out of range for 40 rows"):
                t_gpu.scatter(int(bad.data_ptr()), True, 3, int(d_vals.data_ptr()), stream)
            torch.cuda.synchronize()
            assert all(torch.equal(c.cpu(), h) for c, h in zip(gpu, host)), dtype
    # scatter-add (float32 / float64 on the GPU: atomics) vs the CPU, with duplicates
    for dtype in (torch.float32, torch.float64):
        a_cpu = torch.zeros(10, 3, dtype=dtype)
        a_gpu = a_cpu.to(dev)
        dup = torch.tensor([4, 4, 1, 4])
        v = torch.arange(12, dtype=dtype).reshape(4, 3)
        code = code_of(dtype)
        on_cpu = _wholemem.Table([int(a_cpu.data_ptr())], 10, 10, 3, 3, 1, code)
        on_gpu = _wholemem.Table([int(a_gpu.data_ptr())], 10, 10, 3, 3, 1, code, True, dev.index)
        on_cpu.scatter_add(int(dup.data_ptr()), True, 4, int(v.data_ptr()), 0.5)
        dd, dv = dup.to(dev), v.to(dev)
        on_gpu.scatter_add(int(dd.data_ptr()), True, 4, int(dv.data_ptr()), 0.5, stream)
        assert torch.allclose(a_gpu.cpu(), a_cpu)
    h16 = torch.zeros(4, 2, dtype=torch.float16, device=dev)
    t16 = _wholemem.Table([int(h16.data_ptr())], 4, 4, 2, 2, 1, code_of(torch.float16), True, dev.index)
    one = torch.zeros(1, dtype=torch.int64, device=dev)
    with pytest.raises(TypeError, match="float32 and float64 only"):
        t16.scatter_add(int(one.data_ptr()), True, 1, int(h16.data_ptr()), 1.0, stream)


def test_device_tables_match_the_cpu_tables() -> None:
    run_spawn(_table_body, 1, timeout=300)


def _capture_body(rank: int, size: int, store: str) -> None:
    from distkit_common.dtypes import code_of

    dev = torch.device("cuda", torch.cuda.current_device())
    data = torch.arange(60, dtype=torch.float32, device=dev).reshape(20, 3)
    table = _wholemem.Table([int(data.data_ptr())], 20, 20, 3, 3, 1, code_of(torch.float32), True, dev.index)
    idx = torch.tensor([3, 19, 0], device=dev)
    out = torch.zeros(3, 3, device=dev)
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        table.gather(int(idx.data_ptr()), True, 3, int(out.data_ptr()), s.cuda_stream)  # warm-up
        with torch.cuda.graph(graph, stream=s):  # nothing may synchronise or allocate here
            table.gather(int(idx.data_ptr()), True, 3, int(out.data_ptr()), s.cuda_stream)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, data[[3, 19, 0]])
    # an out-of-range index inside a replay is skipped and reported by the next checked call
    idx[1] = 25
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[1], torch.zeros(3, device=dev))
    ok = torch.tensor([1], device=dev)
    with pytest.raises(IndexError, match="CUDA graph capture or replay"):
        table.gather(int(ok.data_ptr()), True, 1, int(out.data_ptr()), torch.cuda.current_stream(dev).cuda_stream)


def test_device_table_inside_cuda_graph_capture() -> None:
    run_spawn(_capture_body, 1, timeout=300)


# -- tensor types on the GPU, several ranks sharing the GPU --------------------------------


def _types_body(rank: int, size: int, store: str) -> None:
    import wholemem as wg

    T = wg.WmTensorType
    from wholemem import _devmem

    comm = _comm(rank, size, store)
    dev = torch.device("cuda", torch.cuda.current_device())
    for ty in (T.CHUNKED, T.NCCL):
        for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.int64):
            t = wg.create_wm_tensor(comm, [23, 5], [7, 1], dtype, ty, device="cuda")
            assert t.is_gpu and t.device == dev
            local, first = wg.get_local_tensor(t)
            assert local.device == dev
            rows = torch.arange(first, first + local.shape[0])
            local.copy_(enc(rows, 5, dtype).to(dev))
            comm.barrier()
            g = torch.Generator().manual_seed(rank)
            idx = torch.randint(0, 23, (64,), generator=g)
            for ix in (idx, idx.to(torch.int32), idx.to(dev)):  # CPU and device indices
                assert torch.equal(wg.gather(t, ix).cpu(), enc(idx, 5, dtype)), (ty, dtype)
            sub = wg.get_sub_tensor(t, [2, 1], [20, 4])
            assert torch.equal(
                wg.gather(sub, torch.tensor([0, 17])).cpu(), enc(torch.tensor([2, 19]), 5, dtype)[:, 1:4]
            )
            comm.barrier()
            mine = torch.arange(rank, 23, size)
            wg.scatter(t, mine.to(dev), enc(mine, 5, dtype, salt=9).to(dev))
            comm.barrier()
            assert torch.equal(wg.gather(t, torch.arange(23)).cpu(), enc(torch.arange(23), 5, dtype, salt=9))
            with pytest.raises(IndexError, match="index 23 at position 1"):
                wg.gather(t, torch.tensor([0, 23], device=dev))
            comm.barrier()
    # DEVICE: the node leader's allocation, seen on this rank's GPU by every rank
    d = wg.create_wm_tensor(comm, [17, 3], [], torch.float64, T.DEVICE)
    assert d.device == dev and wg.get_wm_tensor_type(d) is T.DEVICE
    d[rank::size] = enc(torch.arange(rank, 17, size), 3, torch.float64).to(dev)
    comm.barrier()
    assert torch.equal(d.cpu(), enc(torch.arange(17), 3, torch.float64))
    assert torch.equal(
        wg.gather(d, torch.tensor([16, 0], device=dev)).cpu(), enc(torch.tensor([16, 0]), 3, torch.float64)
    )
    comm.barrier()
    # HOST viewed from the GPU: GPU writes land in the shared pages every rank reads
    h = wg.create_wm_tensor(comm, [11, 4], [], torch.int32, T.HOST)
    hv = wg.get_tensor_view(h, "cuda")
    assert hv.device == dev and hv.data_ptr() != 0
    wg.scatter(hv, torch.tensor([rank], device=dev), enc(torch.tensor([rank]), 4, torch.int32).to(dev))
    comm.barrier()
    assert torch.equal(h[:size], enc(torch.arange(size), 4, torch.int32))
    # a host CHUNKED tensor viewed from the GPU: CUDA kernels over the mapped chunks
    c = wg.create_wm_tensor(comm, [13, 2], [], torch.float32, T.CHUNKED)
    cl, cf = wg.get_local_tensor(c)
    cl.copy_(enc(torch.arange(cf, cf + cl.shape[0]), 2, torch.float32))
    comm.barrier()
    cv = wg.get_tensor_view(c, "cuda")
    assert cv.is_gpu and torch.equal(wg.gather(cv, torch.arange(13)).cpu(), enc(torch.arange(13), 2, torch.float32))
    comm.barrier()
    # files: DEVICE tensors and CUDA views are staged through host memory
    path = f"{store}.files"
    wg.store_to_files(d, path, num_parts=3)
    d2 = wg.create_wm_tensor(comm, [17, 3], [], torch.float64, T.NCCL, device="cuda")
    wg.load_from_files(d2, path)
    assert torch.equal(wg.gather(d2, torch.arange(17)).cpu(), d.cpu())
    comm.barrier()
    # everything dropped on every rank: the exported chunks are freed without destroy
    assert _devmem.live_chunks() == (1 if rank == 0 else 0)  # the DEVICE allocation is rank 0's
    del t, local, sub, d, d2, hv, cv, c, cl
    gc.collect()
    comm.barrier()
    assert _devmem.live_chunks() == 0
    _close(comm)


def test_gpu_tensor_types_on_three_ranks() -> None:
    run_spawn(_types_body, 3, timeout=300)


def _loop_body(rank: int, size: int, store: str) -> None:
    import wholemem as wg
    from wholemem import _devmem

    comm = _comm(rank, size, store)
    for _ in range(20):
        t = wg.create_wm_tensor(comm, [1 << 16, 64], [], torch.float32, wg.WmTensorType.CHUNKED, device="cuda")
        assert _devmem.live_chunks() <= 2  # this one, and the previous one if a peer still held it
        del t
        gc.collect()
    comm.barrier()
    assert _devmem.live_chunks() == 0
    _close(comm)


def test_gpu_chunked_tensors_in_a_loop_are_freed() -> None:
    run_spawn(_loop_body, 2, timeout=300)


def _nccl_one_rank_body(rank: int, size: int, store: str) -> None:
    import wholemem as wg

    wg.init_lib()
    comm = wg.create_communicator(1, wg.get_unique_id(), 0)  # device group: a real NCCL group
    dev = torch.device("cuda", torch.cuda.current_device())
    t = wg.create_wm_tensor(comm, [9, 4], [], torch.float16, wg.WmTensorType.NCCL, device="cuda")
    assert comm._dev_pg is not None and t.device == dev
    wg.scatter(t, torch.arange(9, device=dev), enc(torch.arange(9), 4, torch.float16).to(dev))
    assert torch.equal(wg.gather(t, torch.tensor([8, 1])).cpu(), enc(torch.tensor([8, 1]), 4, torch.float16))
    emb = wg.Embedding(comm, 9, 4, optimizer=wg.SGD(lr=0.5), tensor_type=wg.WmTensorType.NCCL, device="cuda")
    emb(torch.tensor([2, 2], device=dev)).sum().backward()
    before = wg.gather(emb.weight, torch.tensor([2])).clone()
    emb.step()
    assert torch.allclose(wg.gather(emb.weight, torch.tensor([2])), before - 0.5 * 2)
    comm.destroy()
    wg.finalize_lib()


def test_nccl_tensor_with_one_rank_over_nccl() -> None:
    run_spawn(_nccl_one_rank_body, 1, timeout=300)


def _gloo_uid_body(rank: int, size: int, store: str) -> None:
    import torch.distributed as dist

    import wholemem as wg

    wg.init_lib()
    fs = dist.FileStore(store, size)
    if rank == 0:
        uid = wg.get_unique_id()
        fs.set("uid", json.dumps([uid.host, uid.port, uid.token]))
    host, port, token = json.loads(fs.get("uid"))
    comm = wg.create_communicator(size, wg.UniqueId(host, port, token), rank, device_backend="gloo")
    dev = torch.device("cuda", torch.cuda.current_device())
    t = wg.create_wm_tensor(comm, [31, 3], [], torch.int64, wg.WmTensorType.NCCL, device="cuda")
    mine = torch.arange(rank, 31, size)
    wg.scatter(t, mine.to(dev), enc(mine, 3, torch.int64).to(dev))  # rows owned by other ranks
    comm.barrier()
    idx = torch.randint(0, 31, (50,), generator=torch.Generator().manual_seed(rank))
    assert torch.equal(wg.gather(t, idx.to(dev)).cpu(), enc(idx, 3, torch.int64))
    comm.destroy()
    wg.finalize_lib()


def test_nccl_tensor_on_ranks_sharing_a_gpu_over_gloo() -> None:
    run_spawn(_gloo_uid_body, 3, timeout=300)


# -- Embedding on the GPU vs the same Embedding on the CPU ---------------------------------


def _embedding_body(rank: int, size: int, store: str) -> None:
    import wholemem as wg

    T = wg.WmTensorType
    comm = _comm(rank, size, store)
    dev = torch.device("cuda", torch.cuda.current_device())
    n, d = 29, 6
    init = torch.randn(n, d, generator=torch.Generator().manual_seed(5))
    optimizers = [
        wg.SGD(lr=0.1, weight_decay=0.01),
        wg.Adagrad(lr=0.1),
        wg.LazyAdam(lr=0.05, weight_decay=0.01),
        wg.RMSProp(lr=0.05),
    ]
    for opt in optimizers:
        for ty, dtype in ((T.NCCL, torch.float32), (T.CHUNKED, torch.float64), (T.DEVICE, torch.float32)):
            cpu = wg.Embedding(comm, n, d, optimizer=opt, tensor_type=T.HOST, dtype=dtype, init=init.to(dtype))
            kw = {} if ty is T.DEVICE else {"device": "cuda"}
            gpu = wg.Embedding(comm, n, d, optimizer=opt, tensor_type=ty, dtype=dtype, init=init.to(dtype), **kw)
            for step in range(5):
                g = torch.Generator().manual_seed(100 * step + rank)
                idx = torch.randint(0, n, (12,), generator=g)
                target = torch.randn(12, d, generator=g, dtype=torch.float64)
                for emb, ix in ((cpu, idx), (gpu, idx.to(dev))):
                    rows = emb(ix)
                    ((rows - target.to(rows.device, rows.dtype)) ** 2).sum().backward()
                    emb.step()
            got = wg.gather(gpu.weight, torch.arange(n)).cpu()
            want = wg.gather(cpu.weight, torch.arange(n))
            tol = 1e-5 if dtype == torch.float32 else 1e-12
            assert torch.allclose(got, want, atol=tol, rtol=tol), (type(opt).__name__, ty, (got - want).abs().max())
            for a, b in zip(gpu.optimizer_states, cpu.optimizer_states):
                assert torch.allclose(a.cpu(), b, atol=tol, rtol=tol), type(opt).__name__
    _close(comm)


def test_gpu_embedding_matches_cpu_for_every_optimizer() -> None:
    run_spawn(_embedding_body, 2, timeout=600)
