"""``WholeGraphStore``: a PyG ``GraphStore`` over :class:`wholemem.GraphStructure`."""

from __future__ import annotations

from typing import Any

import torch

from .. import GraphStructure
from .._graph_tensors import is_direct, read_rows
from ._pyg import EdgeAttr, EdgeLayout, GraphStore


def materialize(t: Any) -> torch.Tensor:
    """A torch tensor of all of ``t`` (itself when directly addressable; a gather of every
    row otherwise, collective for NCCL tensors)."""
    if is_direct(t):
        return t
    return read_rows(t, torch.arange(int(t.shape[0]), dtype=torch.int64))


class WholeGraphStore(GraphStore):
    """A PyG :class:`~torch_geometric.data.GraphStore` whose edges live in a :class:`wholemem.GraphStructure`.

    A ``GraphStructure`` is PyG's CSC layout: row ``v`` of the CSR lists the nodes whose
    messages flow into ``v`` (PyG's ``edge_index[0]`` of the edges into
    ``edge_index[1] = v``); that is, ``(row, colptr) = (csr_col_ind, csr_row_ptr)``.

    ``put_edge_index`` takes a ``GraphStructure`` (stored by reference, any layout
    argument; the shared arrays are used as they are) or PyG edge indices: CSC
    ``(row, colptr)`` is wrapped without a copy, COO ``(row, col)`` and CSR
    ``(rowptr, col)`` are converted into a private CSR keyed by destination.
    ``get_edge_index`` answers in any layout; arrays of CHUNKED / NCCL graphs are
    materialised by a gather (collective for NCCL).

    Parameters
    ----------
    graph : GraphStructure, optional
        Registered for ``edge_type`` (PyG's ``None`` for a homogeneous graph).
    edge_type : optional
        Its edge type.
    """

    def __init__(self, graph: GraphStructure | None = None, *, edge_type: Any = None) -> None:
        super().__init__()
        self._graphs: dict[Any, GraphStructure] = {}
        if graph is not None:
            self.put_edge_index(graph, edge_type=edge_type, layout="csc", size=(graph.node_count, graph.node_count))

    def __repr__(self) -> str:
        return f"WholeGraphStore({ {str(k): repr(v) for k, v in self._graphs.items()} })"

    def graph(self, edge_type: Any = None) -> GraphStructure:
        """Return the GraphStructure of ``edge_type``.

        Parameters
        ----------
        edge_type : optional
            The edge type (PyG's ``None`` for a homogeneous graph).

        Returns
        -------
        GraphStructure
            The graph registered for it.

        Raises
        ------
        KeyError
            No edges of that type.
        """
        if edge_type not in self._graphs:
            raise KeyError(f"no edges of type {edge_type!r} in this WholeGraphStore")
        return self._graphs[edge_type]

    def _put_edge_index(self, edge_index: Any, edge_attr: EdgeAttr) -> bool:
        if isinstance(edge_index, GraphStructure):
            edge_index.require_csr()
            self._graphs[edge_attr.edge_type] = edge_index
            return True
        if not isinstance(edge_index, (tuple, list)) or len(edge_index) != 2:
            raise TypeError("edge_index must be a wholemem.GraphStructure or a pair of tensors")
        a, b = edge_index
        layout = EdgeLayout(edge_attr.layout)
        size = edge_attr.size
        g = GraphStructure()
        if layout == EdgeLayout.CSC:  # (row, colptr): our CSR as it is
            g.set_csr_graph(b, a)
        else:
            if layout == EdgeLayout.CSR:  # (rowptr, col) -> COO rows
                a = torch.repeat_interleave(torch.arange(a.numel() - 1, dtype=torch.int64), a[1:] - a[:-1])
            row, col = torch.as_tensor(a).to(torch.int64), torch.as_tensor(b).to(torch.int64)
            if size is not None:
                n = max(int(size[0]), int(size[1]))
            else:
                n = int(max(int(row.max()), int(col.max())) + 1) if row.numel() else 0
            g = GraphStructure.from_edge_list(None, col, row, n)  # keyed by destination
        self._graphs[edge_attr.edge_type] = g
        return True

    def _get_edge_index(self, edge_attr: EdgeAttr) -> Any:
        g = self._graphs.get(edge_attr.edge_type)
        if g is None:
            return None
        layout = EdgeLayout(edge_attr.layout)
        colptr, row = materialize(g.csr_row_ptr), materialize(g.csr_col_ind)
        if layout == EdgeLayout.CSC:
            return row, colptr
        col = torch.repeat_interleave(
            torch.arange(g.node_count, dtype=torch.int64, device=colptr.device), colptr.diff()
        )
        if layout == EdgeLayout.COO:
            return row.to(torch.int64), col
        order = torch.argsort(row, stable=True)  # CSR: grouped by source
        rowptr = torch.zeros(g.node_count + 1, dtype=torch.int64, device=colptr.device)
        rowptr[1:] = torch.cumsum(torch.bincount(row.to(torch.int64), minlength=g.node_count), 0)
        return rowptr, col[order]

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        return self._graphs.pop(edge_attr.edge_type, None) is not None

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        """List every stored graph's edge attributes (PyG's ``GraphStore`` hook).

        Returns
        -------
        list of EdgeAttr
            One per edge type, in CSC layout.
        """
        return [
            EdgeAttr(edge_type, EdgeLayout.CSC, is_sorted=True, size=(g.node_count, g.node_count))
            for edge_type, g in self._graphs.items()
        ]
