"""WholeGraph's sampling functions, over CSR arrays or a :class:`GraphStructure`."""

from __future__ import annotations

import inspect
from typing import Any, overload

import torch

from ._graph import WEIGHT, GraphStructure
from ._graph_sample import sample_csr

_GRAPH_FORM = inspect.Signature(
    [
        inspect.Parameter("graph", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("center_nodes_tensor", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("max_sample_count", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("random_seed", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("need_center_local_output", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False),
        inspect.Parameter("need_edge_output", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False),
        inspect.Parameter("weight_name", inspect.Parameter.KEYWORD_ONLY, default=WEIGHT),
    ]
)


def _wholegraph_form(weighted: bool) -> inspect.Signature:
    names = ["wm_csr_row_ptr_tensor", "wm_csr_col_ptr_tensor"] + (["wm_csr_weight_ptr_tensor"] if weighted else [])
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    params += list(_GRAPH_FORM.parameters.values())[1:-1]
    return inspect.Signature(params)


def _bind(name: str, weighted: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
    graph_form = (args and isinstance(args[0], GraphStructure)) or isinstance(kwargs.get("graph"), GraphStructure)
    sig = _GRAPH_FORM if graph_form else _wholegraph_form(weighted)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{name}{sig}: {e}") from None
    bound.apply_defaults()
    return bound


def _sample(name: str, weighted: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    b = _bind(name, weighted, args, kwargs).arguments
    if "graph" in b:
        g: GraphStructure = b["graph"]
        g.require_csr()
        weights = None
        if weighted:
            if b["weight_name"] not in g.edge_attributes:
                raise KeyError(f"{name}: the graph has no edge attribute {b['weight_name']!r} (weights)")
            weights = g.edge_attributes[b["weight_name"]]
        row_ptr, col = g.csr_row_ptr, g.csr_col_ind
    else:
        row_ptr, col = b["wm_csr_row_ptr_tensor"], b["wm_csr_col_ptr_tensor"]
        weights = b.get("wm_csr_weight_ptr_tensor")
    r = sample_csr(
        row_ptr,
        col,
        weights,
        b["center_nodes_tensor"],
        b["max_sample_count"],
        b["random_seed"],
        bool(b["need_center_local_output"]),
    )
    return r.wholegraph_tuple(bool(b["need_center_local_output"]), bool(b["need_edge_output"]))


@overload
def unweighted_sample_without_replacement(
    graph: GraphStructure,
    center_nodes_tensor: torch.Tensor,
    max_sample_count: int,
    random_seed: int | None = None,
    need_center_local_output: bool = False,
    need_edge_output: bool = False,
) -> tuple[torch.Tensor, ...]: ...
@overload
def unweighted_sample_without_replacement(
    wm_csr_row_ptr_tensor: Any,
    wm_csr_col_ptr_tensor: Any,
    center_nodes_tensor: torch.Tensor,
    max_sample_count: int,
    random_seed: int | None = None,
    need_center_local_output: bool = False,
    need_edge_output: bool = False,
) -> tuple[torch.Tensor, ...]: ...
def unweighted_sample_without_replacement(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """Sample up to ``max_sample_count`` distinct neighbours of every center, uniformly.

    WholeGraph's ``unweighted_sample_without_replacement(wm_csr_row_ptr_tensor,
    wm_csr_col_ptr_tensor, center_nodes_tensor, max_sample_count, random_seed=None,
    need_center_local_output=False, need_edge_output=False)``, or the same with a
    :class:`GraphStructure` in place of the two arrays.

    A center with degree <= ``max_sample_count`` gets all its neighbours, in CSR order;
    any other gets ``max_sample_count`` distinct ones, every such set equally likely.
    Center i draws from its own Philox stream (key ``random_seed``, counter i), so a seed
    gives the same result for any number of threads, and on CPU and GPU.

    Parameters
    ----------
    wm_csr_row_ptr_tensor, wm_csr_col_ptr_tensor : wholemem tensor or torch.Tensor
        The CSR (int64 row pointer; int32 / int64 column ids), or ``graph``.
    center_nodes_tensor : torch.Tensor
        1-D int32 / int64 node ids, on the graph's device (CPU, or the GPU of a GPU graph).
    max_sample_count : int
        At least 1 (WholeGraph took <= 0 as "all neighbours"; here it is an error).
    random_seed : int, optional
        In [0, 2^64); default: drawn from torch's default generator.
    need_center_local_output, need_edge_output : bool
        Also return each sample's center index (int32) / edge id (int64, its position in
        the column array).

    Returns
    -------
    tuple of torch.Tensor
        ``(sample_offset, dest[, center_local][, edge_id])`` (WholeGraph's layout):
        ``sample_offset`` int32 ``[n + 1]``, the samples of center i being
        ``dest[sample_offset[i]:sample_offset[i + 1]]`` (the column dtype).

    Raises
    ------
    TypeError
        Wrong argument types or dtypes.
    ValueError
        ``max_sample_count <= 0``, a seed out of range, arrays or centers on different
        devices, non-1-D tensors, or a corrupt row pointer.
    IndexError
        A center outside ``[0, node_count)`` (the message names it and its position).

    Notes
    -----
    Collective when an array is an NCCL (DISTRIBUTED) tensor: every rank calls with its
    own centers, and a bad argument on one rank raises on all of them.
    """
    return _sample("unweighted_sample_without_replacement", False, args, kwargs)


@overload
def weighted_sample_without_replacement(
    graph: GraphStructure,
    center_nodes_tensor: torch.Tensor,
    max_sample_count: int,
    random_seed: int | None = None,
    need_center_local_output: bool = False,
    need_edge_output: bool = False,
    *,
    weight_name: str = WEIGHT,
) -> tuple[torch.Tensor, ...]: ...
@overload
def weighted_sample_without_replacement(
    wm_csr_row_ptr_tensor: Any,
    wm_csr_col_ptr_tensor: Any,
    wm_csr_weight_ptr_tensor: Any,
    center_nodes_tensor: torch.Tensor,
    max_sample_count: int,
    random_seed: int | None = None,
    need_center_local_output: bool = False,
    need_edge_output: bool = False,
) -> tuple[torch.Tensor, ...]: ...
def weighted_sample_without_replacement(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """Sample up to ``max_sample_count`` distinct neighbours, weighted, without replacement.

    WholeGraph's ``weighted_sample_without_replacement(wm_csr_row_ptr_tensor,
    wm_csr_col_ptr_tensor, wm_csr_weight_ptr_tensor, center_nodes_tensor,
    max_sample_count, random_seed=None, need_center_local_output=False,
    need_edge_output=False)``, or with a :class:`GraphStructure` first (weights from its
    edge attribute ``weight_name``, default ``"weight"``).

    Degree <= ``max_sample_count``: all neighbours in CSR order. Otherwise neighbours are
    drawn one after another, each with probability proportional to its weight among
    those not yet drawn (A-Res keys ``log(u) / w``, the top ``max_sample_count`` win, as
    WholeGraph). Weights are float32 / float64, finite and >= 0; a weight-0 edge is
    taken only when fewer than ``max_sample_count`` neighbours weigh more.

    Returns
    -------
    tuple of torch.Tensor
        ``(sample_offset, dest[, center_local][, edge_id])``, as
        :func:`unweighted_sample_without_replacement`.

    Raises
    ------
    TypeError
        Wrong argument types or dtypes.
    KeyError
        A graph without the weight attribute.
    ValueError
        ``max_sample_count <= 0``, weights of another length than the columns, devices
        that differ, or a corrupt row pointer.
    IndexError
        A center outside ``[0, node_count)``.
    """
    return _sample("weighted_sample_without_replacement", True, args, kwargs)
