"""Neighbour sampling over CSR arrays and ``append_unique``, as WholeGraph offers them.

The work is native (``csrc/graph_sample.hpp``: per-center code shared by the CPU loop
and the CUDA kernel); this module validates, sizes the outputs and picks the access
path for each array (see ``_graph_tensors``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from distkit_common.validate import as_index_tensor, check_int

from . import _wholemem
from ._graph_collective import agree
from ._graph_tensors import comm_of, device_of, is_array, is_collective, is_direct, read_rows

#: seeds are unsigned 64-bit (the Philox key)
_SEED_BOUND = 1 << 64


def _check_array(t: Any, name: str, dtypes: tuple[torch.dtype, ...]) -> None:
    if not is_array(t):
        raise TypeError(f"{name} must be a wholemem tensor or a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must have dtype {want}, got {t.dtype}")
    if isinstance(t, torch.Tensor) and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_csr_arrays(row_ptr: Any, col: Any, weights: Any = None) -> None:
    """Types, dtypes and shapes of CSR arrays (content is checked by GraphStructure)."""
    _check_array(row_ptr, "csr_row_ptr", (torch.int64,))
    _check_array(col, "csr_col_ind", (torch.int32, torch.int64))
    if row_ptr.shape[0] < 1:
        raise ValueError("csr_row_ptr must have at least one entry (node_count + 1)")
    if weights is not None:
        _check_array(weights, "csr_weight_ptr", (torch.float32, torch.float64))
        if weights.shape[0] != col.shape[0]:
            raise ValueError(f"csr_weight_ptr has {weights.shape[0]} entries, csr_col_ind {col.shape[0]}")


def resolve_seed(random_seed: Any) -> int:
    """The Philox key: ``random_seed`` (any int in [0, 2^64)), or one drawn from torch's
    default generator (so ``torch.manual_seed`` makes unseeded calls reproducible)."""
    if random_seed is None:
        hi, lo = torch.randint(0, 1 << 32, (2,), dtype=torch.int64).tolist()
        return (int(hi) << 32) | int(lo)
    return check_int(random_seed, "random_seed", lo=0, hi=_SEED_BOUND)


@dataclass
class SampleResult:
    """One sampling call: offsets int32 [n + 1], dest (col dtype), center_local int32, edge_id int64."""

    offsets: torch.Tensor
    dest: torch.Tensor
    center_local: torch.Tensor | None
    edge_id: torch.Tensor

    def wholegraph_tuple(self, need_center_local_output: bool, need_edge_output: bool) -> tuple[torch.Tensor, ...]:
        """WholeGraph's return layout: (offsets, dest[, center_local][, edge_gid])."""
        out = [self.offsets, self.dest]
        if need_center_local_output:
            assert self.center_local is not None
            out.append(self.center_local)
        if need_edge_output:
            out.append(self.edge_id)
        return tuple(out)


class DeviceOps:
    """The two device steps of GPU sampling (the CUDA kernels); tests substitute a CPU stand-in."""

    def counts(self, a: Any, device: torch.device) -> None:
        _wholemem.csr_sample_counts_cuda(a, _index(device), torch.cuda.current_stream(device).cuda_stream)

    def fill(self, a: Any, device: torch.device) -> None:
        _wholemem.csr_sample_fill_cuda(a, _index(device), torch.cuda.current_stream(device).cuda_stream)


_device_ops = DeviceOps()


def set_device_ops(ops: DeviceOps) -> DeviceOps:
    """Replace the device steps (testing hook); returns the previous ones."""
    global _device_ops
    old, _device_ops = _device_ops, ops
    return old


def _on_gpu(device: torch.device) -> bool:
    """Whether arrays on ``device`` are sampled by the CUDA kernels."""
    return device.type != "cpu"


def _index(device: torch.device) -> int:
    return int(device.index) if device.index is not None else int(torch.cuda.current_device())


def _centers(center_nodes: Any, num_nodes: int, device: torch.device, check_range: bool, on_gpu: bool) -> torch.Tensor:
    """The centers as a contiguous 1-D int32/int64 tensor on ``device`` (range-checked here
    unless the native pass does it)."""
    if not isinstance(center_nodes, torch.Tensor):
        raise TypeError(f"center_nodes must be a torch.Tensor, got {type(center_nodes).__name__}")
    if center_nodes.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"center_nodes must have dtype int32 or int64, got {center_nodes.dtype}")
    if center_nodes.dim() != 1:
        raise ValueError(f"center_nodes must be 1-D, got shape {tuple(center_nodes.shape)}")
    if center_nodes.device != device:
        raise ValueError(
            f"center_nodes is on {center_nodes.device}, but the graph is read on {device}: centers and graph arrays "
            "must be on the same device (GraphStructure.view(device) maps a graph for a GPU)"
        )
    c = center_nodes.contiguous()
    if not check_range:
        return c
    if not on_gpu:
        return as_index_tensor(c, "center_nodes", upper=num_nodes, dtypes=("int64", "int32"))
    if c.numel():
        bad = (c < 0) | (c >= num_nodes)
        if bool(bad.any()):
            pos = int(torch.nonzero(bad)[0, 0])
            v = int(c[pos])
            what = "is negative" if v < 0 else f"is out of range [0, {num_nodes})"
            raise IndexError(f"center_nodes[{pos}] = {v} {what}")
    return c


def _array_device(row_ptr: Any, col: Any, weights: Any) -> torch.device:
    devs = {str(device_of(t)) for t in (row_ptr, col, weights) if t is not None}
    if len(devs) != 1:
        raise ValueError(f"the graph arrays live on different devices: {sorted(devs)}")
    return device_of(row_ptr)


def sample_csr(
    row_ptr: Any,
    col: Any,
    weights: Any,
    center_nodes: Any,
    max_sample_count: Any,
    random_seed: Any,
    need_center_local_output: bool,
) -> SampleResult:
    """Sample without replacement: up to ``max_sample_count`` neighbours of every center.

    Collective when any array is an NCCL tensor (every rank must call, with its own
    centers); a bad argument on one rank then raises on every rank.
    """
    check_csr_arrays(row_ptr, col, weights)
    collective = any(is_collective(t) for t in (row_ptr, col, weights) if t is not None)
    comm = next((comm_of(t) for t in (row_ptr, col, weights) if t is not None and comm_of(t) is not None), None)
    err: Exception | None = None
    try:
        k = check_int(max_sample_count, "max_sample_count")
        if k <= 0:
            raise ValueError(f"max_sample_count must be > 0, got {k}")
        seed = resolve_seed(random_seed)
        device = _array_device(row_ptr, col, weights)
        num_nodes = int(row_ptr.shape[0]) - 1
        # the native CPU pass checks the centers against a directly read row pointer itself
        on_gpu = _on_gpu(device)
        native_checks = not on_gpu and is_direct(row_ptr)
        centers = _centers(center_nodes, num_nodes, device, not native_checks, on_gpu)
    except Exception as e:
        if not collective:
            raise
        err = e
    if collective:
        agree(comm, "sampling", err)  # no rank may stay behind in the gathers below
    return _run(row_ptr, col, weights, centers, k, seed, need_center_local_output, device, on_gpu)


def _run(
    row_ptr: Any,
    col: Any,
    weights: Any,
    centers: torch.Tensor,
    k: int,
    seed: int,
    need_center_local: bool,
    device: torch.device,
    on_gpu: bool,
) -> SampleResult:
    n = int(centers.numel())
    a = _wholemem.SampleArgs()
    a.num_nodes, a.num_edges, a.n, a.k, a.seed = int(row_ptr.shape[0]) - 1, int(col.shape[0]), n, k, seed
    keep: list[torch.Tensor] = [centers]  # everything the native code points into stays alive here
    starts = ends = None
    if is_direct(row_ptr):
        a.row_ptr, a.centers, a.centers64 = (
            int(row_ptr.data_ptr()),
            int(centers.data_ptr()),
            centers.dtype == torch.int64,
        )
    else:
        c64 = centers.to(torch.int64)
        bounds = read_rows(row_ptr, torch.cat([c64, c64 + 1]))
        starts, ends = bounds[:n].contiguous(), bounds[n:].contiguous()
        keep += [starts, ends]
        a.starts, a.ends = int(starts.data_ptr()), int(ends.data_ptr())
    offsets = torch.zeros(n + 1, dtype=torch.int32, device=device)
    a.offsets = int(offsets.data_ptr())
    total = _device_offsets(a, offsets, device) if on_gpu else int(_wholemem.csr_sample_offsets(a))
    edge_id = torch.empty(total, dtype=torch.int64, device=device)
    a.edge_id = int(edge_id.data_ptr())
    center_local = torch.empty(total, dtype=torch.int32, device=device) if need_center_local else None
    if center_local is not None:
        a.center_local = int(center_local.data_ptr())
    dest = None
    if is_direct(col):
        dest = torch.empty(total, dtype=col.dtype, device=device)
        a.col, a.col64, a.dest = int(col.data_ptr()), col.dtype == torch.int64, int(dest.data_ptr())
    else:
        a.col64 = col.dtype == torch.int64
    if weights is not None:
        keys = torch.empty(total, dtype=torch.float64, device=device)
        keep.append(keys)
        a.keys, a.weights64 = int(keys.data_ptr()), weights.dtype == torch.float64
        if is_direct(weights):
            a.weights = int(weights.data_ptr())
        else:
            wbuf, wofs = _compact_weights(row_ptr, weights, centers, starts, ends, k)
            keep += [wbuf, wofs]
            # with no list to weigh (every degree <= k) any valid address marks the call weighted
            a.weights = int(wbuf.data_ptr()) if wbuf.numel() else int(wofs.data_ptr())
            a.weight_offsets = int(wofs.data_ptr())
    if total == 0:
        pass  # nothing to draw (the collective reads below still run on every rank)
    elif on_gpu:
        _device_ops.fill(a, device)
    else:
        _wholemem.csr_sample_fill(a)
    if dest is None:
        dest = read_rows(col, edge_id)  # collective for an NCCL col
    del keep
    return SampleResult(offsets, dest, center_local, edge_id)


def _device_offsets(a: Any, offsets: torch.Tensor, device: torch.device) -> int:
    """Counts by kernel, prefix sum by torch on the device; returns the total (one sync)."""
    _device_ops.counts(a, device)
    csum = torch.cumsum(offsets[1:].to(torch.int64), 0)
    total = int(csum[-1]) if csum.numel() else 0
    if total > torch.iinfo(torch.int32).max:
        raise ValueError(
            "a sampling call may return at most 2^31 - 1 neighbours (int32 offsets, as WholeGraph); "
            "split the centers into smaller batches"
        )
    offsets[1:] = csum.to(torch.int32)
    return total


def _compact_weights(
    row_ptr: Any,
    weights: Any,
    centers: torch.Tensor,
    starts: torch.Tensor | None,
    ends: torch.Tensor | None,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights of the centers that need them (degree > k), gathered into one buffer, and
    each center's offset into it (the others point at 0 and never read)."""
    if starts is None or ends is None:  # a directly read row pointer
        c64 = centers.to(torch.int64)
        starts, ends = row_ptr[c64], row_ptr[c64 + 1]
    deg = ends - starts
    need = deg > k
    lens = torch.where(need, deg, torch.zeros_like(deg))
    wofs = torch.cumsum(lens, 0) - lens
    total = int(lens.sum()) if lens.numel() else 0
    # edge ids of every needed neighbour list, concatenated
    rep_start = torch.repeat_interleave(starts - wofs, lens, output_size=total)
    idx = rep_start + torch.arange(total, dtype=torch.int64, device=starts.device)
    wbuf = read_rows(weights, idx).contiguous()  # collective for an NCCL weight array
    return wbuf, wofs.contiguous()


def append_unique(
    target_node_tensor: torch.Tensor,
    neighbor_node_tensor: torch.Tensor,
    need_neighbor_raw_to_unique: bool = False,
) -> Any:
    """Return the targets followed by the neighbours not seen before (WholeGraph's ``append_unique``).

    ``output_unique_node = [targets..., new neighbours in order of first appearance]``:
    the targets keep their positions (a repeated target too), and each neighbour id not
    among the targets or earlier neighbours is appended once. With
    ``need_neighbor_raw_to_unique``, ``neighbor_raw_to_unique_mapping[j]`` (int32) is the
    position of ``neighbor_node_tensor[j]`` in the output (its first occurrence), i.e. the
    local index of each sampled neighbour: with the sampler's offsets it is the sampled
    block in CSR form, with its center-local ids in COO form. WholeGraph left the order of
    the new ids unspecified; here it is the order of first appearance (PyG's), the same on
    CPU and GPU.

    Parameters
    ----------
    target_node_tensor, neighbor_node_tensor : torch.Tensor
        1-D, both int32 or both int64, on the same device (CPU: native hash table; CUDA:
        torch ops).
    need_neighbor_raw_to_unique : bool, default False
        Whether to also return the position of every neighbour in the output.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        ``output_unique_node`` (the ids' dtype), and the int32 mapping when asked for.

    Raises
    ------
    TypeError
        Not tensors, or dtypes other than int32 / int64, or different dtypes.
    ValueError
        Not 1-D, on different devices or neither CPU nor CUDA, or more than 2^31 - 1 ids.
    """
    t, nb = target_node_tensor, neighbor_node_tensor
    for x, name in ((t, "target_node_tensor"), (nb, "neighbor_node_tensor")):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must have dtype int32 or int64, got {x.dtype}")
        if x.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
    if t.dtype != nb.dtype:
        raise TypeError(f"target_node_tensor ({t.dtype}) and neighbor_node_tensor ({nb.dtype}) must have one dtype")
    if t.device != nb.device:
        raise ValueError(f"target_node_tensor is on {t.device}, neighbor_node_tensor on {nb.device}: use one device")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"append_unique runs on the CPU or a CUDA device, got {t.device}")
    if t.numel() + nb.numel() > torch.iinfo(torch.int32).max:
        raise ValueError("append_unique handles at most 2^31 - 1 ids (int32 positions, as WholeGraph)")
    if t.device.type == "cpu":
        unique, mapping = _append_unique_cpu(t.contiguous(), nb.contiguous(), need_neighbor_raw_to_unique)
    else:
        unique, mapping = append_unique_torch(t, nb)
    if need_neighbor_raw_to_unique:
        return unique, mapping
    return unique


def _append_unique_cpu(t: torch.Tensor, nb: torch.Tensor, need_map: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = torch.empty(t.numel() + nb.numel(), dtype=t.dtype)
    mapping = torch.empty(nb.numel(), dtype=torch.int32) if need_map else None
    m = _wholemem.append_unique(
        int(t.data_ptr()) if t.numel() else 0,
        int(t.numel()),
        int(nb.data_ptr()) if nb.numel() else 0,
        int(nb.numel()),
        t.dtype == torch.int64,
        int(out.data_ptr()) if out.numel() else 0,
        int(mapping.data_ptr()) if mapping is not None and mapping.numel() else 0,
    )
    return out[:m], mapping


def append_unique_torch(t: torch.Tensor, nb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``append_unique`` with torch ops (any device): the same output as the native one."""
    nt = t.numel()
    allv = torch.cat([t, nb])
    if allv.numel() == 0:
        return allv, torch.empty(0, dtype=torch.int32, device=t.device)
    uniq, inv = torch.unique(allv, return_inverse=True)
    pos = torch.arange(allv.numel(), device=t.device)
    first = torch.full((uniq.numel(),), allv.numel(), dtype=torch.int64, device=t.device)
    first.scatter_reduce_(0, inv, pos, reduce="amin")
    new = first >= nt  # values first seen among the neighbours
    new_first = first[new]
    order = torch.argsort(new_first)
    rank_of_new = torch.empty_like(order)
    rank_of_new[order] = torch.arange(order.numel(), device=t.device)
    place = first.clone()  # a value seen among the targets: its first target position
    place[new] = nt + rank_of_new
    unique = torch.cat([t, allv[new_first[order]]])
    mapping = place[inv[nt:]].to(torch.int32)
    return unique, mapping
