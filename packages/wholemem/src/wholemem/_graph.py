"""``GraphStructure``: a CSR graph (and node / edge attributes) in wholemem tensors."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import torch

from ._comm import WholeMemoryCommunicator
from ._graph_build import BuildOptions, build_csr
from ._graph_check import check_csr_content, check_weights_content
from ._graph_io import load_graph, load_wholegraph_files, save_graph
from ._graph_sample import append_unique, check_csr_arrays, resolve_seed, sample_csr
from ._graph_tensors import comm_of, device_of, is_array, tensor_type_name, view_on
from ._tensor import WmTensorType

#: the edge attribute holding edge weights (weighted sampling reads it by default)
WEIGHT = "weight"
#: the edge attribute holding edge features (``edge_features=`` of from_edge_list)
FEATURES = "features"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def derive_seed(seed: int, hop: int) -> int:
    """A different, reproducible Philox key per hop (splitmix64 of seed + hop)."""
    z = (seed + 0x9E3779B97F4A7C15 * (hop + 1)) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


class GraphStructure:
    """The graph structure of one relation in CSR form, with node and edge attributes.

    pylibwholegraph's ``GraphStructure``; made empty (``GraphStructure()``) or by the class methods below.

    ``csr_row_ptr`` (int64, ``node_count + 1`` entries) and ``csr_col_ind`` (int32 or
    int64, ``edge_count`` entries): the neighbours of node ``v`` are
    ``csr_col_ind[csr_row_ptr[v]:csr_row_ptr[v + 1]]``, and edge ``e`` is position ``e``
    of ``csr_col_ind``. The arrays are wholemem tensors of any type (HOST, CHUNKED,
    NCCL / DISTRIBUTED, DEVICE) or plain torch tensors (a private graph). Sampling
    from node ``v`` picks among those neighbours; for GNN message passing the messages
    flow from the sampled neighbour to ``v`` (PyG's ``edge_index[0] -> edge_index[1]``).

    Build one with :meth:`from_edge_list` (collective), :meth:`from_files` (WholeGraph's
    raw file lists), :meth:`load` (a directory written by :meth:`save`), or
    :meth:`set_csr_graph` on arrays you made.

    Attributes
    ----------
    node_count, edge_count : int
    csr_row_ptr, csr_col_ind : wholemem tensor or torch.Tensor
    node_attributes, edge_attributes : dict of str to tensor
        Rows per node / per edge (``edge_attributes["weight"]`` holds edge weights).
    comm : WholeMemoryCommunicator or None
        The communicator of the arrays (None for a private graph).
    """

    def __init__(self) -> None:
        self.node_count = 0
        self.edge_count = 0
        self.csr_row_ptr: Any = None
        self.csr_col_ind: Any = None
        self.node_attributes: dict[str, Any] = {}
        self.edge_attributes: dict[str, Any] = {}
        self.comm: WholeMemoryCommunicator | None = None

    # -- building ------------------------------------------------------------------
    def set_csr_graph(self, csr_row_ptr: Any, csr_col_ind: Any, *, validate: bool = True) -> None:
        """Set the CSR arrays (collective when they are wholemem tensors and ``validate``).

        Parameters
        ----------
        csr_row_ptr : wholemem tensor or torch.Tensor
            An int64, 1-D array of ``node_count + 1`` entries.
        csr_col_ind : wholemem tensor or torch.Tensor
            An int32 or int64, 1-D array of ``edge_count`` entries; same communicator.
        validate : bool, default True
            Check the content (row pointer starts at 0, never decreases, ends at
            ``edge_count``; column ids in ``[0, node_count)``), each rank its own part.
            The samplers index ``csr_col_ind`` with the row pointer: only skip this for
            arrays built correctly by construction.

        Raises
        ------
        TypeError
            Not tensors, wrong dtypes, or arrays of different communicators.
        ValueError
            Not 1-D / not contiguous, a malformed row pointer (on every rank).
        IndexError
            A column id out of range (on every rank).
        """
        check_csr_arrays(csr_row_ptr, csr_col_ind)
        comm = comm_of(csr_row_ptr)
        if comm is not comm_of(csr_col_ind):
            raise TypeError("csr_row_ptr and csr_col_ind must be wholemem tensors of one communicator (or both plain)")
        if device_of(csr_row_ptr) != device_of(csr_col_ind):
            raise ValueError(
                f"csr_row_ptr is on {device_of(csr_row_ptr)}, csr_col_ind on {device_of(csr_col_ind)}: use one device"
            )
        if validate:
            check_csr_content(comm, csr_row_ptr, csr_col_ind)
        self.comm = comm
        self.csr_row_ptr, self.csr_col_ind = csr_row_ptr, csr_col_ind
        self.node_count = int(csr_row_ptr.shape[0]) - 1
        self.edge_count = int(csr_col_ind.shape[0])

    def _check_attr(self, kind: str, name: Any, tensor: Any, rows: int, table: dict[str, Any]) -> None:
        if self.csr_row_ptr is None:
            raise RuntimeError(f"set the CSR graph before any {kind} attribute")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{kind} attribute names are identifiers ([A-Za-z_][A-Za-z0-9_]*), got {name!r}")
        if name in table:
            raise ValueError(f"{kind} attribute {name!r} is already set")
        if not is_array(tensor):
            raise TypeError(f"{kind} attribute {name!r} must be a wholemem tensor or a torch.Tensor")
        if tensor.dim() < 1 or int(tensor.shape[0]) != rows:
            raise ValueError(f"{kind} attribute {name!r} must have {rows} rows, got shape {tuple(tensor.shape)}")
        if comm_of(tensor) is not None and self.comm is not None and comm_of(tensor) is not self.comm:
            raise ValueError(f"{kind} attribute {name!r} lives on another communicator than the graph")

    def set_node_attribute(self, attr_name: str, attr_tensor: Any) -> None:
        """Attach rows per node (e.g. features, labels) under ``attr_name``.

        Parameters
        ----------
        attr_name : str
            The attribute's name.
        attr_tensor : wholemem tensor or torch.Tensor
            ``node_count`` rows.

        Raises
        ------
        RuntimeError
            No CSR graph set yet.
        ValueError
            A bad or repeated name, or not ``node_count`` rows.
        TypeError
            Not a tensor.
        """
        self._check_attr("node", attr_name, attr_tensor, self.node_count, self.node_attributes)
        self.node_attributes[attr_name] = attr_tensor

    def set_edge_attribute(self, attr_name: str, attr_tensor: Any, *, validate: bool = True) -> None:
        """Attach rows per edge under ``attr_name``; ``"weight"`` holds sampling weights.

        Parameters
        ----------
        attr_name : str
            The attribute's name.
        attr_tensor : wholemem tensor or torch.Tensor
            ``edge_count`` rows; for ``"weight"`` 1-D float32 / float64, finite and >= 0.
        validate : bool, default True
            Check the weights (collectively, each rank its own part).

        Raises
        ------
        RuntimeError
            No CSR graph set yet.
        ValueError
            A bad or repeated name, not ``edge_count`` rows, or bad weights (on every rank).
        TypeError
            Not a tensor, or weights that are not 1-D float32 / float64.
        """
        self._check_attr("edge", attr_name, attr_tensor, self.edge_count, self.edge_attributes)
        if attr_name == WEIGHT:
            if attr_tensor.dim() != 1 or attr_tensor.dtype not in (torch.float32, torch.float64):
                raise TypeError(
                    f"edge weights must be 1-D float32 or float64, got {attr_tensor.dtype} {tuple(attr_tensor.shape)}"
                )
            if validate:
                check_weights_content(comm_of(attr_tensor), attr_name, attr_tensor)
        self.edge_attributes[attr_name] = attr_tensor

    @classmethod
    def from_edge_list(
        cls,
        comm: WholeMemoryCommunicator | None,
        src: Any,
        dst: Any,
        num_nodes: int,
        *,
        edge_weight: torch.Tensor | None = None,
        edge_features: torch.Tensor | None = None,
        tensor_type: WmTensorType = WmTensorType.HOST,
        col_dtype: torch.dtype = torch.int64,
        add_reverse_edges: bool = False,
        remove_self_loops: bool = False,
        add_self_loops: bool = False,
        remove_duplicates: bool = False,
    ) -> GraphStructure:
        """Collective: build the CSR of the edges ``src[i] -> dst[i]`` that every rank contributes.

        Row ``v`` of the result lists the destinations of ``v``'s edges, sorted; the
        result is the same for any number of ranks and any split of the edges.

        Parameters
        ----------
        comm : WholeMemoryCommunicator or None
            Every rank calls with its part of the edges; None builds a private graph
            (plain tensors) in this process.
        src, dst : torch.Tensor or numpy.ndarray
            1-D int32 / int64 node ids in ``[0, num_nodes)``, one entry per edge.
        num_nodes : int
            Number of nodes (the same on every rank).
        edge_weight : torch.Tensor, optional
            One float32 / float64 per edge, finite and >= 0; stored as edge attribute ``"weight"``.
        edge_features : torch.Tensor, optional
            ``[num_edges, ...]`` rows per edge; stored as edge attribute ``"features"``.
        tensor_type : WmTensorType, default HOST
            Storage of the arrays (HOST: one shared copy per node).
        col_dtype : torch.dtype, default torch.int64
            The column ids' dtype: int32 halves the column array for graphs below 2^31 nodes.
        add_reverse_edges : bool
            Add ``dst -> src`` for every edge (an undirected graph from one direction).
        remove_self_loops : bool
            Drop the edges ``v -> v``.
        add_self_loops : bool
            Give every node exactly one edge ``v -> v`` (existing ones are dropped first;
            added ones get weight 1 and zero features).
        remove_duplicates : bool
            Keep one edge per (src, dst): the first in the order (source, destination,
            originals before reverse edges, rank 0's input first, then each rank's in order).

        Returns
        -------
        GraphStructure
            The graph (the same on every rank).

        Raises
        ------
        TypeError
            Ids / weights of the wrong dtype, or tensors that are not tensors (on every rank).
        ValueError
            Mismatched lengths, bad weights, or ranks that disagree on ``num_nodes``, the
            flags, the types or the attribute layout (on every rank).
        IndexError
            A node id outside ``[0, num_nodes)`` (on every rank).
        """
        if not isinstance(tensor_type, WmTensorType):
            raise TypeError(f"tensor_type must be a wholemem.WmTensorType, got {tensor_type!r}")
        if col_dtype not in (torch.int32, torch.int64):
            raise TypeError(f"col_dtype must be torch.int32 or torch.int64, got {col_dtype!r}")
        if comm is not None and not isinstance(comm, WholeMemoryCommunicator):
            raise TypeError(f"comm must be a wholemem.WholeMemoryCommunicator or None, got {type(comm).__name__}")
        opts = BuildOptions(
            num_nodes=0,
            tensor_type=tensor_type,
            col_dtype=col_dtype,
            add_reverse_edges=bool(add_reverse_edges),
            remove_self_loops=bool(remove_self_loops),
            add_self_loops=bool(add_self_loops),
            remove_duplicates=bool(remove_duplicates),
        )
        arrays = build_csr(comm, src, dst, num_nodes, edge_weight, edge_features, opts)
        g = cls()
        g.set_csr_graph(arrays["row_ptr"], arrays["col_idx"], validate=False)  # valid by construction
        if arrays["weight"] is not None:
            g.set_edge_attribute(WEIGHT, arrays["weight"], validate=False)
        if arrays["features"] is not None:
            g.set_edge_attribute(FEATURES, arrays["features"])
        return g

    @classmethod
    def from_files(
        cls,
        comm: WholeMemoryCommunicator,
        csr_row_ptr_file: str | os.PathLike[str],
        csr_col_ind_file: str | os.PathLike[str],
        *,
        col_dtype: torch.dtype = torch.int64,
        tensor_type: WmTensorType = WmTensorType.CHUNKED,
        edge_weight_file: str | os.PathLike[str] | None = None,
        weight_dtype: torch.dtype = torch.float32,
    ) -> GraphStructure:
        """Load WholeGraph's raw CSR file lists and check them (collective).

        Each list is the file itself, or its parts ``<file>_part_<i>_of_<n>``, as
        :func:`create_wm_tensor_from_file` reads them.

        Parameters
        ----------
        comm : WholeMemoryCommunicator
            The ranks that share the arrays.
        csr_row_ptr_file : path
            The int64 row pointer's file (list).
        csr_col_ind_file : path
            The column ids' file (list).
        col_dtype : torch.dtype
            The column ids' type in the files: int32 or int64.
        tensor_type : WmTensorType
            Storage of the arrays.
        edge_weight_file : path, optional
            The edge weights' file (list), stored as edge attribute ``"weight"``.
        weight_dtype : torch.dtype
            The weights' type in the files: float32 or float64.

        Returns
        -------
        GraphStructure
            The graph.

        Raises
        ------
        FileNotFoundError
            A file or part is missing.
        ValueError
            Files that are not a whole number of elements, or a malformed CSR (every rank).
        IndexError
            A column id out of range (every rank).
        """
        arrays = load_wholegraph_files(
            comm, csr_row_ptr_file, csr_col_ind_file, col_dtype, tensor_type, edge_weight_file, weight_dtype
        )
        g = cls()
        g.set_csr_graph(arrays[0], arrays[1])
        if edge_weight_file is not None:
            g.set_edge_attribute(WEIGHT, arrays[2])
        return g

    def save(self, directory: str | os.PathLike[str], *, num_parts: int | None = None) -> None:
        """Store the arrays and attributes under ``directory`` (collective).

        Any number of parts, each array as :func:`store_to_files` writes it, plus ``graph.json``.

        Parameters
        ----------
        directory : path
            The folder to write.
        num_parts : int, optional
            Number of files per array; one per rank when None.

        Raises
        ------
        TypeError
            A private graph (plain tensors): store wholemem graphs only.
        OSError
            The files cannot be written.
        """
        self.require_csr()
        arrays = {"row_ptr": self.csr_row_ptr, "col_idx": self.csr_col_ind}
        arrays |= {f"edge_{k}": v for k, v in self.edge_attributes.items()}
        arrays |= {f"node_{k}": v for k, v in self.node_attributes.items()}
        save_graph(self.comm, arrays, self.node_count, self.edge_count, directory, num_parts)

    @classmethod
    def load(
        cls,
        comm: WholeMemoryCommunicator,
        directory: str | os.PathLike[str],
        *,
        tensor_type: WmTensorType = WmTensorType.HOST,
    ) -> GraphStructure:
        """Load a graph stored by :meth:`save`, in tensors of ``tensor_type``, and check it (collective).

        Parameters
        ----------
        comm : WholeMemoryCommunicator
            The ranks that share the arrays (any number).
        directory : path
            The folder :meth:`save` wrote.
        tensor_type : WmTensorType
            Storage of the arrays.

        Returns
        -------
        GraphStructure
            The graph.

        Raises
        ------
        FileNotFoundError
            ``graph.json`` or a part is missing.
        ValueError
            A malformed ``graph.json`` or CSR (on every rank).
        """
        arrays = load_graph(comm, directory, tensor_type)
        g = cls()
        g.set_csr_graph(arrays.pop("row_ptr"), arrays.pop("col_idx"))
        for name, t in arrays.items():
            kind, attr = name.split("_", 1)
            if kind == "edge":
                g.set_edge_attribute(attr, t)
            else:
                g.set_node_attribute(attr, t)
        return g

    def view(self, device: Any) -> GraphStructure:
        """Return the graph as seen from ``device``.

        Each wholemem array goes through :func:`get_tensor_view` (e.g. a HOST graph
        mapped for a GPU without a copy).

        Parameters
        ----------
        device : str or torch.device
            ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.

        Returns
        -------
        GraphStructure
            A graph over the views (attributes included).

        Raises
        ------
        RuntimeError
            A CUDA device without a usable GPU.
        ValueError
            A private array that is not already on ``device``.
        """
        g = GraphStructure()
        g.comm, g.node_count, g.edge_count = self.comm, self.node_count, self.edge_count
        g.csr_row_ptr, g.csr_col_ind = view_on(self.csr_row_ptr, device), view_on(self.csr_col_ind, device)
        g.node_attributes = {k: view_on(v, device) for k, v in self.node_attributes.items()}
        g.edge_attributes = {k: view_on(v, device) for k, v in self.edge_attributes.items()}
        return g

    # -- accessors -----------------------------------------------------------------
    @property
    def row_ptr(self) -> Any:
        """Return ``csr_row_ptr`` (an alias).

        Returns
        -------
        wholemem tensor or torch.Tensor
            The row pointer.
        """
        return self.csr_row_ptr

    @property
    def col_idx(self) -> Any:
        """Return ``csr_col_ind`` (an alias).

        Returns
        -------
        wholemem tensor or torch.Tensor
            The column ids.
        """
        return self.csr_col_ind

    @property
    def edge_weight(self) -> Any:
        """Return edge attribute ``"weight"``.

        Returns
        -------
        wholemem tensor, torch.Tensor or None
            The weights, or None.
        """
        return self.edge_attributes.get(WEIGHT)

    @property
    def edge_features(self) -> Any:
        """Return edge attribute ``"features"``.

        Returns
        -------
        wholemem tensor, torch.Tensor or None
            The features, or None.
        """
        return self.edge_attributes.get(FEATURES)

    @property
    def tensor_type(self) -> str:
        """Name the storage of the arrays.

        Returns
        -------
        str
            ``HOST`` / ``CHUNKED`` / ``NCCL`` / ``DEVICE``, or ``private`` for plain tensors.
        """
        return tensor_type_name(self.csr_row_ptr) if self.csr_row_ptr is not None else "unset"

    def __repr__(self) -> str:
        return (
            f"GraphStructure(nodes={self.node_count}, edges={self.edge_count}, type={self.tensor_type}, "
            f"node_attributes={sorted(self.node_attributes)}, edge_attributes={sorted(self.edge_attributes)})"
        )

    def require_csr(self) -> None:
        """Raise ``RuntimeError`` unless the CSR arrays are set."""
        if self.csr_row_ptr is None:
            raise RuntimeError("GraphStructure: no CSR graph set (set_csr_graph / from_edge_list / load)")

    # -- sampling (pylibwholegraph's methods) --------------------------------------
    def unweighted_sample_without_replacement_one_hop(
        self,
        center_nodes_tensor: torch.Tensor,
        max_sample_count: int,
        *,
        random_seed: int | None = None,
        need_center_local_output: bool = False,
        need_edge_output: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        """Sample up to ``max_sample_count`` distinct neighbours of each center, uniformly.

        As :func:`unweighted_sample_without_replacement` on this graph.

        Parameters
        ----------
        center_nodes_tensor : torch.Tensor
            1-D int32 / int64 node ids.
        max_sample_count : int
            Neighbours per center at most (> 0).
        random_seed : int, optional
            Seed of the Philox streams; drawn at random when None.
        need_center_local_output : bool
            Also return every sampled edge's center index (``center_local``).
        need_edge_output : bool
            Also return every sampled edge's id (``edge_id``).

        Returns
        -------
        tuple of torch.Tensor
            ``(sample_offset, dest[, center_local][, edge_id])``: ``dest`` holds the
            neighbours of center ``i`` at ``sample_offset[i]:sample_offset[i + 1]``.

        Raises
        ------
        RuntimeError
            No CSR graph set.
        TypeError, ValueError, IndexError
            Bad centers, count or seed, as :func:`unweighted_sample_without_replacement`.
        """
        self.require_csr()
        r = sample_csr(
            self.csr_row_ptr,
            self.csr_col_ind,
            None,
            center_nodes_tensor,
            max_sample_count,
            random_seed,
            need_center_local_output,
        )
        return r.wholegraph_tuple(need_center_local_output, need_edge_output)

    def weighted_sample_without_replacement_one_hop(
        self,
        weight_name: str,
        center_nodes_tensor: torch.Tensor,
        max_sample_count: int,
        *,
        random_seed: int | None = None,
        need_center_local_output: bool = False,
        need_edge_output: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        """Sample up to ``max_sample_count`` distinct neighbours of each center, by weight.

        Drawn one after another with probability proportional to the weights in edge
        attribute ``weight_name``, as :func:`weighted_sample_without_replacement`.

        Parameters
        ----------
        weight_name : str
            The edge attribute holding the weights.
        center_nodes_tensor : torch.Tensor
            1-D int32 / int64 node ids.
        max_sample_count : int
            Neighbours per center at most (> 0).
        random_seed : int, optional
            Seed of the Philox streams; drawn at random when None.
        need_center_local_output : bool
            Also return every sampled edge's center index (``center_local``).
        need_edge_output : bool
            Also return every sampled edge's id (``edge_id``).

        Returns
        -------
        tuple of torch.Tensor
            ``(sample_offset, dest[, center_local][, edge_id])``: ``dest`` holds the
            neighbours of center ``i`` at ``sample_offset[i]:sample_offset[i + 1]``.

        Raises
        ------
        KeyError
            No edge attribute ``weight_name``.
        RuntimeError
            No CSR graph set.
        TypeError, ValueError, IndexError
            Bad centers, count or seed, as :func:`weighted_sample_without_replacement`.
        """
        self.require_csr()
        if weight_name not in self.edge_attributes:
            raise KeyError(f"no edge attribute {weight_name!r} (have {sorted(self.edge_attributes)})")
        r = sample_csr(
            self.csr_row_ptr,
            self.csr_col_ind,
            self.edge_attributes[weight_name],
            center_nodes_tensor,
            max_sample_count,
            random_seed,
            need_center_local_output,
        )
        return r.wholegraph_tuple(need_center_local_output, need_edge_output)

    def multilayer_sample_without_replacement(
        self,
        node_ids: torch.Tensor,
        max_neighbors: Sequence[int],
        weight_name: str | None = None,
        *,
        random_seed: int | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Sample ``len(max_neighbors)`` hops outward from ``node_ids``, layer 0 the outermost.

        pylibwholegraph's multi-hop sampler.

        Parameters
        ----------
        node_ids : torch.Tensor
            1-D int32 / int64 seed nodes.
        max_neighbors : sequence of int
            Fan-out of each hop, outermost first (each > 0).
        weight_name : str, optional
            Sample by the weights in this edge attribute; uniformly when None.
        random_seed : int, optional
            Seed of the sampler; drawn at random when None.

        Returns
        -------
        target_gids : list of torch.Tensor
            ``target_gids[hops]`` = ``node_ids``; ``target_gids[i]`` = the node ids of
            layer i: ``target_gids[i + 1]`` followed by the new neighbours (append_unique).
        edge_indice : list of torch.Tensor
            ``[2, E_i]`` per layer: row 0 the neighbour's index in ``target_gids[i]``,
            row 1 the center's index in ``target_gids[i + 1]``.
        csr_row_ptr, csr_col_ind : list of torch.Tensor
            The same block as CSR: per-center offsets (int32) and neighbour indices.

        Raises
        ------
        RuntimeError
            No CSR graph set.
        KeyError
            ``weight_name`` is not an edge attribute.
        TypeError, ValueError, IndexError
            Bad node ids, fan-outs (each > 0) or seed.
        """
        self.require_csr()
        hops = len(max_neighbors)
        seed = resolve_seed(random_seed)
        target_gids: list[Any] = [None] * (hops + 1)
        edge_indice: list[Any] = [None] * hops
        row_ptrs: list[Any] = [None] * hops
        col_inds: list[Any] = [None] * hops
        target_gids[hops] = node_ids
        for i in range(hops - 1, -1, -1):
            fanout = max_neighbors[hops - i - 1]
            hop_seed = derive_seed(seed, hops - i - 1)
            if weight_name is None:
                offsets, dest, src_lids = self.unweighted_sample_without_replacement_one_hop(
                    target_gids[i + 1], fanout, random_seed=hop_seed, need_center_local_output=True
                )
            else:
                offsets, dest, src_lids = self.weighted_sample_without_replacement_one_hop(
                    weight_name, target_gids[i + 1], fanout, random_seed=hop_seed, need_center_local_output=True
                )
            unique_gids, mapping = append_unique(target_gids[i + 1], dest, need_neighbor_raw_to_unique=True)
            row_ptrs[i], col_inds[i] = offsets, mapping
            edge_indice[i] = torch.stack([mapping, src_lids])
            target_gids[i] = unique_gids
        return target_gids, edge_indice, row_ptrs, col_inds
