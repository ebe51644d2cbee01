"""GraphStructure on N ranks against a single-process build (run under mpiexec).

usage: worker_graph.py <shared tmp dir>
Every rank contributes an uneven slice of one edge list; the shared graph of every
tensor type must equal the private graph built from the whole list, sample the same
for the same seed (collectively for NCCL graphs), survive a save / load with another
number of parts, and turn a bad argument on one rank into an error on every rank.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from mpi4py import MPI

import wholemem as wg

T = wg.WmTensorType
N, E = 97, 2000


def everything(comm: wg.WholeMemoryCommunicator, t: object) -> torch.Tensor:
    """All rows of a wholemem tensor (collective for NCCL tensors)."""
    return wg.gather(t, torch.arange(t.shape[0]))


def expect(exc: type[BaseException], match: str, fn, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    try:
        fn(*args, **kwargs)
    except exc as e:
        msg = str(e)
    else:
        raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")
    if match not in msg:
        raise AssertionError(f"{match!r} not in {msg!r}")
    return msg


def main() -> None:
    tmp = Path(sys.argv[1])
    mpi = MPI.COMM_WORLD
    rank, size = mpi.Get_rank(), mpi.Get_size()
    wg.init_lib()
    comm = wg.communicator_from_mpi4py(mpi)
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, N, (E,), generator=gen), torch.randint(0, N, (E,), generator=gen)
    w = torch.rand(E, generator=gen, dtype=torch.float64)
    feats = torch.randn(E, 3, generator=gen).to(torch.bfloat16)
    cuts = [0, *sorted(torch.randint(0, E, (size - 1,), generator=gen).tolist()), E]
    mine = slice(cuts[rank], cuts[rank + 1])
    flags = {"add_reverse_edges": True, "add_self_loops": True, "remove_duplicates": True}
    ref = wg.GraphStructure.from_edge_list(None, src, dst, N, edge_weight=w, edge_features=feats, **flags)
    mine_gen = torch.Generator().manual_seed(100 + rank)
    centers = torch.randint(0, N, (40 + 17 * rank,), generator=mine_gen)
    for ty in (T.HOST, T.CHUNKED, T.NCCL):
        g = wg.GraphStructure.from_edge_list(
            comm, src[mine], dst[mine], N, edge_weight=w[mine], edge_features=feats[mine], tensor_type=ty, **flags
        )
        assert g.tensor_type == ty.name
        assert torch.equal(everything(comm, g.csr_row_ptr), ref.csr_row_ptr), ty
        assert torch.equal(everything(comm, g.csr_col_ind), ref.csr_col_ind), ty
        assert torch.equal(everything(comm, g.edge_weight), ref.edge_weight), ty
        assert torch.equal(everything(comm, g.edge_features), ref.edge_features), ty
        for fn in (wg.unweighted_sample_without_replacement, wg.weighted_sample_without_replacement):
            got = fn(g, centers, 5, 31 + rank, True, True)
            want = fn(ref, centers, 5, 31 + rank, True, True)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (ty, fn.__name__)
        comm.barrier()

    # NCCL graphs sample collectively: a bad center on the last rank raises on every rank
    g = wg.GraphStructure.from_edge_list(comm, src[mine], dst[mine], N, tensor_type=T.NCCL)
    bad = torch.tensor([N + 5]) if rank == size - 1 else torch.tensor([0, 1])
    msg = expect(IndexError, "center_nodes[0]", wg.unweighted_sample_without_replacement, g, bad, 3, 1)
    if rank != size - 1 and size > 1:
        assert f"failed on rank {size - 1}" in msg, msg
    # ... and the group still works afterwards
    off, _ = wg.unweighted_sample_without_replacement(g, torch.tensor([rank % N]), 3, 1)
    assert off.numel() == 2

    # disagreeing arguments raise on every rank instead of hanging
    expect(ValueError, "num_nodes", wg.GraphStructure.from_edge_list, comm, src[mine], dst[mine], N + (rank == 0))
    bad_src = src[mine].clone()
    if rank == size - 1 and bad_src.numel():
        bad_src[-1] = N
    if bad_src.numel():
        expect(IndexError, "src", wg.GraphStructure.from_edge_list, comm, bad_src, dst[mine], N)

    # save with another number of parts, load as another type
    h = wg.GraphStructure.from_edge_list(comm, src[mine], dst[mine], N, edge_weight=w[mine], tensor_type=T.CHUNKED)
    h.save(tmp / "g", num_parts=size + 2)
    for ty in (T.HOST, T.NCCL):
        k = wg.GraphStructure.load(comm, tmp / "g", tensor_type=ty)
        assert torch.equal(everything(comm, k.csr_col_ind), everything(comm, h.csr_col_ind))
        assert torch.equal(everything(comm, k.edge_weight), everything(comm, h.edge_weight))

    comm.destroy()
    wg.finalize_lib()
    mpi.Barrier()
    if rank == 0:
        print(f"worker_graph OK {size}", flush=True)


if __name__ == "__main__":
    main()
