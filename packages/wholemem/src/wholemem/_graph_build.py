"""Collective construction of a CSR graph from an edge list spread over the ranks.

Every rank contributes a part of the edges. The edges travel to the rank that owns
their source node (the partition plan of the nodes), each rank sorts and filters its
rows and writes them into the shared CSR tensors at its global edge offset. The
result does not depend on the number of ranks or on how the edges were split: edges
are ordered by (source, destination), then originals before added reverse edges, then
by input order (rank 0's edges first, each rank's in its order), and
``remove_duplicates`` keeps the first of that order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from distkit_common.validate import as_index_tensor, check_int

from ._comm import WholeMemoryCommunicator
from ._graph_collective import agree, allgather_int, allgather_json
from ._graph_tensors import create_array, scatter_rows
from ._tensor import WmTensorType

#: sort rank of an edge among equal (source, destination) pairs
_ORIGINAL, _REVERSE, _SELF_LOOP = 0, 1, 2


@dataclass
class EdgeParts:
    """This rank's edges and their attributes (rows aligned)."""

    src: torch.Tensor
    dst: torch.Tensor
    kind: torch.Tensor  #: _ORIGINAL / _REVERSE / _SELF_LOOP (int8)
    weight: torch.Tensor | None
    features: torch.Tensor | None

    def select(self, idx: torch.Tensor) -> EdgeParts:
        return EdgeParts(
            self.src[idx],
            self.dst[idx],
            self.kind[idx],
            None if self.weight is None else self.weight[idx],
            None if self.features is None else self.features[idx],
        )

    @staticmethod
    def cat(parts: list[EdgeParts]) -> EdgeParts:
        w = [p.weight for p in parts]
        f = [p.features for p in parts]
        return EdgeParts(
            torch.cat([p.src for p in parts]),
            torch.cat([p.dst for p in parts]),
            torch.cat([p.kind for p in parts]),
            None if w[0] is None else torch.cat(w),  # type: ignore[arg-type]
            None if f[0] is None else torch.cat(f),  # type: ignore[arg-type]
        )


@dataclass
class BuildOptions:
    """What from_edge_list was asked to do (compared across ranks)."""

    num_nodes: int
    tensor_type: WmTensorType
    col_dtype: torch.dtype
    add_reverse_edges: bool
    remove_self_loops: bool
    add_self_loops: bool
    remove_duplicates: bool

    def describe(self, weight: torch.Tensor | None, features: torch.Tensor | None) -> dict[str, Any]:
        return {
            "num_nodes": self.num_nodes,
            "tensor_type": self.tensor_type.name,
            "col_dtype": str(self.col_dtype),
            "flags": [self.add_reverse_edges, self.remove_self_loops, self.add_self_loops, self.remove_duplicates],
            "edge_weight": None if weight is None else str(weight.dtype),
            "edge_features": None if features is None else [str(features.dtype), list(features.shape[1:])],
        }


def _check_local(
    src: Any, dst: Any, num_nodes: int, edge_weight: Any, edge_features: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    s = as_index_tensor(src, "src", upper=num_nodes, dtypes=("int64", "int32")).to(torch.int64)
    d = as_index_tensor(dst, "dst", upper=num_nodes, dtypes=("int64", "int32")).to(torch.int64)
    if s.numel() != d.numel():
        raise ValueError(f"src and dst must have the same length, got {s.numel()} and {d.numel()}")
    w = None
    if edge_weight is not None:
        if not isinstance(edge_weight, torch.Tensor):
            raise TypeError(f"edge_weight must be a torch.Tensor, got {type(edge_weight).__name__}")
        if edge_weight.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"edge_weight must have dtype float32 or float64, got {edge_weight.dtype}")
        if edge_weight.device.type != "cpu":
            raise ValueError(f"edge_weight must be on the CPU, got {edge_weight.device}")
        if tuple(edge_weight.shape) != (s.numel(),):
            raise ValueError(
                f"edge_weight must have shape ({s.numel()},) (one per edge), got {tuple(edge_weight.shape)}"
            )
        bad = ~torch.isfinite(edge_weight) | (edge_weight < 0)
        if bool(bad.any()):
            pos = int(torch.nonzero(bad)[0, 0])
            raise ValueError(f"edge_weight[{pos}] = {float(edge_weight[pos])} must be finite and >= 0")
        w = edge_weight.contiguous()
    f = None
    if edge_features is not None:
        if not isinstance(edge_features, torch.Tensor):
            raise TypeError(f"edge_features must be a torch.Tensor, got {type(edge_features).__name__}")
        if edge_features.device.type != "cpu":
            raise ValueError(f"edge_features must be on the CPU, got {edge_features.device}")
        if edge_features.dim() < 2 or edge_features.shape[0] != s.numel():
            raise ValueError(
                f"edge_features must have shape ({s.numel()}, ...) (one row per edge), got {tuple(edge_features.shape)}"
            )
        f = edge_features.contiguous()
    return s, d, w, f


def _local_edges(opts: BuildOptions, s: torch.Tensor, d: torch.Tensor, w: Any, f: Any) -> EdgeParts:
    e = EdgeParts(s, d, torch.full((s.numel(),), _ORIGINAL, dtype=torch.int8), w, f)
    if opts.add_reverse_edges:
        e = EdgeParts.cat([e, EdgeParts(d, s, torch.full((s.numel(),), _REVERSE, dtype=torch.int8), w, f)])
    if opts.remove_self_loops or opts.add_self_loops:
        e = e.select(torch.nonzero(e.src != e.dst).flatten())
    return e


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Rows of any dtype as uint8 rows (the exchange moves raw bytes)."""
    n = t.shape[0]
    row_bytes = math.prod(t.shape[1:]) * t.element_size()
    if t.numel() == 0:
        return torch.empty((n, row_bytes), dtype=torch.uint8)
    return t.contiguous().view(torch.uint8).reshape(n, row_bytes)


def _from_bytes(b: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    if n == 0:
        return torch.empty((0, *like.shape[1:]), dtype=like.dtype)
    return b.contiguous().view(like.dtype).reshape(n, *like.shape[1:])


def _route(comm: WholeMemoryCommunicator | None, e: EdgeParts, num_nodes: int) -> EdgeParts:
    """Send every edge to the rank that owns its source node (rank order kept)."""
    if comm is None or comm.size == 1:
        return e
    k = max(1, (num_nodes + comm.size - 1) // comm.size)
    owner = torch.div(e.src, k, rounding_mode="floor")
    order = torch.argsort(owner, stable=True)
    sc_t = torch.bincount(owner, minlength=comm.size)
    sc, rc = sc_t.tolist(), comm.exchange_counts(sc_t).tolist()
    e = e.select(order)
    out = EdgeParts(
        comm.all_to_all(e.src, sc, rc),
        comm.all_to_all(e.dst, sc, rc),
        comm.all_to_all(e.kind.view(torch.uint8), sc, rc).view(torch.int8),
        None,
        None,
    )
    if e.weight is not None:
        out.weight = _from_bytes(comm.all_to_all(_as_bytes(e.weight[:, None]), sc, rc), e.weight[:, None]).flatten()
    if e.features is not None:
        out.features = _from_bytes(comm.all_to_all(_as_bytes(e.features), sc, rc), e.features)
    return out


def _self_loops(lo: int, hi: int, e: EdgeParts) -> EdgeParts:
    nodes = torch.arange(lo, hi, dtype=torch.int64)
    n = nodes.numel()
    w = None if e.weight is None else torch.ones(n, dtype=e.weight.dtype)
    f = None if e.features is None else torch.zeros((n, *e.features.shape[1:]), dtype=e.features.dtype)
    return EdgeParts(nodes, nodes.clone(), torch.full((n,), _SELF_LOOP, dtype=torch.int8), w, f)


def _sort_and_filter(e: EdgeParts, remove_duplicates: bool) -> EdgeParts:
    """Order by (src, dst, kind), input order kept among equals; drop repeats if asked."""
    perm = torch.argsort(e.kind, stable=True)
    perm = perm[torch.argsort(e.dst[perm], stable=True)]
    perm = perm[torch.argsort(e.src[perm], stable=True)]
    e = e.select(perm)
    if remove_duplicates and e.src.numel() > 1:
        keep = torch.ones(e.src.numel(), dtype=torch.bool)
        keep[1:] = (e.src[1:] != e.src[:-1]) | (e.dst[1:] != e.dst[:-1])
        e = e.select(torch.nonzero(keep).flatten())
    return e


def build_csr(
    comm: WholeMemoryCommunicator | None,
    src: Any,
    dst: Any,
    num_nodes: Any,
    edge_weight: Any,
    edge_features: Any,
    opts: BuildOptions,
) -> dict[str, Any]:
    """Collective: the CSR arrays of the edges of every rank.

    Returns ``{"row_ptr", "col_idx", "weight", "features"}`` (absent attributes: None),
    wholemem tensors of ``opts.tensor_type`` on ``comm`` (plain tensors for comm None).
    """
    step = "GraphStructure.from_edge_list"
    err: Exception | None = None
    desc: dict[str, Any] = {}
    e = None
    try:
        n = check_int(num_nodes, "num_nodes", lo=0)
        opts.num_nodes = n
        s, d, w, f = _check_local(src, dst, n, edge_weight, edge_features)
        desc = opts.describe(w, f)
        e = _local_edges(opts, s, d, w, f)
    except Exception as ex:
        err = ex
    agree(comm, step, err)
    assert e is not None
    descs = allgather_json(comm, desc)
    for r, other in enumerate(descs):
        if other != desc:
            diff = sorted(key for key in desc if desc.get(key) != other.get(key))
            raise ValueError(f"{step}: ranks disagree on {', '.join(diff)} (rank {r}: {other}, this rank: {desc})")
    e = _route(comm, e, opts.num_nodes)
    size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
    k = (opts.num_nodes + size - 1) // size
    lo, hi = min(rank * k, opts.num_nodes), min((rank + 1) * k, opts.num_nodes)
    if opts.add_self_loops:
        e = EdgeParts.cat([e, _self_loops(lo, hi, e)])
    e = _sort_and_filter(e, opts.remove_duplicates)
    counts = allgather_int(comm, int(e.src.numel()))
    offset, num_edges = sum(counts[:rank]), sum(counts)
    deg = torch.bincount(e.src - lo, minlength=hi - lo) if hi > lo else torch.zeros(0, dtype=torch.int64)
    row_vals = offset + torch.cumsum(deg, 0) - deg
    row_idx = torch.arange(lo, hi, dtype=torch.int64)
    if hi > lo and hi == opts.num_nodes:  # the last owner also writes row_ptr[N] = E
        row_vals = torch.cat([row_vals, torch.tensor([num_edges])])
        row_idx = torch.cat([row_idx, torch.tensor([opts.num_nodes])])
    edge_idx = torch.arange(offset, offset + e.src.numel(), dtype=torch.int64)
    out: dict[str, Any] = {
        "row_ptr": create_array(comm, [opts.num_nodes + 1], torch.int64, opts.tensor_type),
        "col_idx": create_array(comm, [num_edges], opts.col_dtype, opts.tensor_type),
        "weight": None,
        "features": None,
    }
    scatter_rows(out["row_ptr"], row_idx, row_vals)
    scatter_rows(out["col_idx"], edge_idx, e.dst.to(opts.col_dtype))
    if e.weight is not None:
        out["weight"] = create_array(comm, [num_edges], e.weight.dtype, opts.tensor_type)
        scatter_rows(out["weight"], edge_idx, e.weight)
    if e.features is not None:
        out["features"] = create_array(comm, [num_edges, *e.features.shape[1:]], e.features.dtype, opts.tensor_type)
        scatter_rows(out["features"], edge_idx, e.features)
    if comm is not None:
        comm.barrier()  # every rank's rows are written before anyone reads
    return out
