"""``NeighborLoader``: PyG mini-batches from wholemem's native sampler, prefetched by a worker."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from distkit_common.validate import as_index_tensor, check_int

from .. import Embedding, GraphStructure, append_unique
from .._graph import FEATURES, derive_seed
from .._graph_sample import resolve_seed, sample_csr
from .._graph_tensors import device_of, is_collective
from ._feature_store import WholeFeatureStore, check_feature, fetch_rows, is_collective_feature
from ._graph_store import WholeGraphStore
from ._pyg import Data

#: PyG's "all neighbours" fan-out (-1) becomes a cap no degree reaches in one call
_ALL = (1 << 31) - 1


@dataclass
class SampledSubgraph:
    """A multi-hop sample in PyG's layout (the seeds first, then each hop's new nodes).

    Parameters
    ----------
    n_id : torch.Tensor
        The int64 global ids; a node's local index is its position.
    edge_index : torch.Tensor
        ``[2, E]`` int64 local ids: row 0 the neighbour, row 1 the center.
    e_id : torch.Tensor
        The int64 edge ids (positions in ``csr_col_ind``).
    num_sampled_nodes : list of int
        New nodes per hop (the seeds first).
    num_sampled_edges : list of int
        Edges per hop.
    """

    n_id: torch.Tensor  #: Global ids (int64); a node's local index is its position.
    edge_index: torch.Tensor  #: Local ids ([2, E], int64): row 0 the neighbour, row 1 the center.
    e_id: torch.Tensor  #: Edge ids (int64): positions in csr_col_ind.
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]


def sample_subgraph(
    graph: GraphStructure,
    seeds: torch.Tensor,
    num_neighbors: Sequence[int],
    random_seed: int | None = None,
    weight_name: str | None = None,
) -> SampledSubgraph:
    """Sample ``len(num_neighbors)`` hops from ``seeds`` as PyG's ``NeighborLoader`` does.

    Hop h samples up to ``num_neighbors[h]`` neighbours of each node added by hop h - 1
    (the seeds for the first hop; ``-1`` = all neighbours, ``0`` = none). New nodes are
    appended to ``n_id`` in order of first appearance, and every sampled edge points
    from the neighbour (``edge_index[0]``) to its center (``edge_index[1]``), grouped by
    hop, then by center. Collective when the graph is an NCCL graph.

    Hop h draws with the Philox key ``derive_seed(random_seed, h)`` (``random_seed``
    None: drawn from torch's generator).

    Parameters
    ----------
    graph : GraphStructure
        The graph.
    seeds : torch.Tensor
        1-D int32 / int64 seed nodes.
    num_neighbors : sequence of int
        Fan-out per hop (``-1``: all neighbours, ``0``: none).
    random_seed : int, optional
        Seed of the sampler; drawn from torch's generator when None.
    weight_name : str, optional
        Edge attribute of weights for weighted sampling (uniform when None).

    Returns
    -------
    SampledSubgraph
        ``n_id``, ``edge_index``, ``e_id`` and the nodes / edges sampled per hop.

    Raises
    ------
    TypeError
        Seeds that are not an int32 / int64 tensor, fan-outs that are not ints.
    ValueError
        Fan-outs below -1, a seed outside [0, 2^64).
    IndexError
        Seeds outside the graph.
    KeyError
        ``weight_name`` is not an edge attribute.
    """
    graph.require_csr()
    if not isinstance(seeds, torch.Tensor) or seeds.dtype not in (torch.int32, torch.int64) or seeds.dim() != 1:
        raise TypeError("seeds must be a 1-D int32 / int64 torch.Tensor")
    fanouts = [check_int(k, f"num_neighbors[{i}]", lo=-1) for i, k in enumerate(num_neighbors)]
    seed = resolve_seed(random_seed)
    if weight_name is not None and weight_name not in graph.edge_attributes:
        raise KeyError(f"weight_name {weight_name!r} is not an edge attribute (have {sorted(graph.edge_attributes)})")
    dtype = graph.csr_col_ind.dtype
    nodes = seeds.to(device=device_of(graph.csr_row_ptr), dtype=dtype)
    frontier_start = 0
    rows: list[torch.Tensor] = []
    cols: list[torch.Tensor] = []
    eids: list[torch.Tensor] = []
    num_nodes, num_edges = [int(seeds.numel())], []
    weights = None if weight_name is None else graph.edge_attributes[weight_name]
    for hop, fanout in enumerate(fanouts):
        frontier = nodes[frontier_start:]
        if fanout == 0 or frontier.numel() == 0:
            num_nodes.append(0)
            num_edges.append(0)
            frontier_start = nodes.numel()
            continue
        k = _ALL if fanout < 0 else int(fanout)
        r = sample_csr(graph.csr_row_ptr, graph.csr_col_ind, weights, frontier, k, derive_seed(seed, hop), True)
        before = nodes.numel()
        nodes, mapping = append_unique(nodes, r.dest.to(dtype), need_neighbor_raw_to_unique=True)
        assert r.center_local is not None
        rows.append(mapping.to(torch.int64))
        cols.append(r.center_local.to(torch.int64) + frontier_start)
        eids.append(r.edge_id)
        num_nodes.append(int(nodes.numel()) - before)
        num_edges.append(int(r.dest.numel()))
        frontier_start = before
    dev = nodes.device
    row = torch.cat(rows) if rows else torch.empty(0, dtype=torch.int64, device=dev)
    col = torch.cat(cols) if cols else torch.empty(0, dtype=torch.int64, device=dev)
    e_id = torch.cat(eids) if eids else torch.empty(0, dtype=torch.int64, device=dev)
    return SampledSubgraph(nodes.to(torch.int64), torch.stack([row, col]), e_id, num_nodes, num_edges)


@dataclass
class _Prepared:
    """A batch as the worker hands it over: the sample and the rows it could read."""

    index: int
    input_id: torch.Tensor
    sub: SampledSubgraph
    rows: dict[str, torch.Tensor]
    edge_attr: torch.Tensor | None


class NeighborLoader:
    """Iterate over mini-batches of sampled subgraphs as PyG :class:`~torch_geometric.data.Data`.

    Like PyG's ``NeighborLoader``, sampled by wholemem's native sampler (no compiled
    PyG extension needed) while the model trains on the previous batch.

    Each batch holds ``batch_size`` seed nodes from ``input_nodes`` and their sampled
    ``len(num_neighbors)``-hop neighbourhood, with PyG's fields: the feature rows of
    every sampled node (``x``, ``y``, ... by feature name), ``edge_index`` (local ids,
    messages from ``edge_index[0]`` to ``edge_index[1]``), ``n_id`` (global ids, the
    seeds first), ``e_id``, ``input_id`` (positions in ``input_nodes``), ``batch_size``,
    ``num_sampled_nodes`` / ``num_sampled_edges`` per hop, and ``edge_attr`` when the
    graph has edge attribute ``"features"``. The first ``batch_size`` rows of the model's
    output are the seeds'.

    A worker thread samples up to ``prefetch`` batches ahead and reads the rows of
    HOST / CHUNKED / private features (the native code releases the GIL). Rows of
    ``Embedding`` features (differentiable) and of NCCL tensors (collective) are read
    when the batch is handed out, on the caller's thread; an NCCL graph is sampled
    there too, so collectives keep one order on every rank.

    Parameters
    ----------
    graph : GraphStructure or WholeGraphStore
        The graph to sample.
    features : WholeFeatureStore, mapping of str to feature, a feature, or None
        A feature is a wholemem tensor, a torch tensor or a ``wholemem.Embedding`` with
        a row per node. A single one is named ``x``. None: the graph's node attributes.
        Store features of group ``None`` (PyG's homogeneous group) are used.
    num_neighbors : sequence of int
        Fan-out per hop (PyG's: ``-1`` all neighbours, ``0`` none).
    batch_size : int, default 1
        Seed nodes per batch.
    input_nodes : tensor of int or bool, optional
        The seed nodes (ids, or a mask over the nodes); default: every node. For data
        parallel training give each rank its own share (and equal batch counts).
    shuffle : bool, default False
        Shuffle the seeds every epoch.
    drop_last : bool, default False
        Drop the last batch when it has fewer seeds.
    weight_name : str, optional
        Edge attribute of weights for weighted sampling (default: uniform).
    random_seed : int, optional
        Makes shuffling and sampling reproducible: epoch ``e`` uses seeds derived from
        ``(random_seed, e)``. Default: drawn from torch's generator at each epoch start.
    prefetch : int, default 2
        Batches sampled ahead (0: sample on the caller's thread).
    edge_type : optional
        Which graph of a ``WholeGraphStore``.

    Raises
    ------
    TypeError
        Bad argument types, or features that are not tensors / Embeddings.
    ValueError
        Bad sizes (batch_size < 1, fan-outs < -1, features with another number of rows).
    IndexError
        Input nodes outside the graph.
    """

    def __init__(
        self,
        graph: GraphStructure | WholeGraphStore,
        features: Any,
        num_neighbors: Sequence[int],
        batch_size: int = 1,
        input_nodes: Any = None,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        weight_name: str | None = None,
        random_seed: int | None = None,
        prefetch: int = 2,
        edge_type: Any = None,
    ) -> None:
        if isinstance(graph, WholeGraphStore):
            graph = graph.graph(edge_type)
        if not isinstance(graph, GraphStructure):
            raise TypeError(f"graph must be a wholemem.GraphStructure or WholeGraphStore, got {type(graph).__name__}")
        graph.require_csr()
        self.graph = graph
        self.features = self._features(features, graph)
        if isinstance(num_neighbors, (str, bytes)) or not isinstance(num_neighbors, Sequence):
            raise TypeError(f"num_neighbors must be a sequence of ints, got {num_neighbors!r}")
        self.num_neighbors = [check_int(k, f"num_neighbors[{i}]", lo=-1) for i, k in enumerate(num_neighbors)]
        self.batch_size = check_int(batch_size, "batch_size", lo=1)
        self.prefetch = check_int(prefetch, "prefetch", lo=0)
        if weight_name is not None and weight_name not in graph.edge_attributes:
            raise KeyError(
                f"weight_name {weight_name!r} is not an edge attribute (have {sorted(graph.edge_attributes)})"
            )
        self.weight_name = weight_name
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.random_seed = None if random_seed is None else resolve_seed(random_seed)
        self.input_nodes = self._input_nodes(input_nodes, graph.node_count)
        self._epoch = 0
        self._edge_features = graph.edge_attributes.get(FEATURES)
        self._collective_graph = any(is_collective(t) for t in (graph.csr_row_ptr, graph.csr_col_ind, self._weights()))

    # -- configuration ---------------------------------------------------------------
    @staticmethod
    def _features(features: Any, graph: GraphStructure) -> dict[str, Any]:
        if features is None:
            found = dict(graph.node_attributes)
        elif isinstance(features, WholeFeatureStore):
            found = features.features(None)
        elif isinstance(features, Mapping):
            found = dict(features)
        else:
            found = {"x": features}
        for name, f in found.items():
            if not isinstance(name, str):
                raise TypeError(f"feature names must be strings, got {name!r}")
            check_feature(f, name)
            rows = int(f.num_embeddings) if isinstance(f, Embedding) else int(f.shape[0])
            if rows != graph.node_count:
                raise ValueError(f"feature {name!r} has {rows} rows, the graph {graph.node_count} nodes")
        return found

    @staticmethod
    def _input_nodes(input_nodes: Any, n: int) -> torch.Tensor:
        if input_nodes is None:
            return torch.arange(n, dtype=torch.int64)
        if isinstance(input_nodes, torch.Tensor) and input_nodes.dtype == torch.bool:
            if input_nodes.shape != (n,):
                raise ValueError(f"a boolean input_nodes mask must have shape ({n},), got {tuple(input_nodes.shape)}")
            return torch.nonzero(input_nodes.cpu()).flatten()
        idx = as_index_tensor(input_nodes, "input_nodes", upper=n, dtypes=("int64", "int32"), allow_sequence=True)
        return idx.to(torch.int64)

    def _weights(self) -> Any:
        return None if self.weight_name is None else self.graph.edge_attributes[self.weight_name]

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (as ``DistributedSampler.set_epoch``).

        With a ``random_seed``, its shuffle and samples depend on (seed, epoch) only.

        Parameters
        ----------
        epoch : int
            The epoch, >= 0.

        Raises
        ------
        TypeError
            Not an int.
        ValueError
            Negative.
        """
        self._epoch = check_int(epoch, "epoch", lo=0)

    def __len__(self) -> int:
        n = int(self.input_nodes.numel())
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __repr__(self) -> str:
        return (
            f"NeighborLoader(num_neighbors={self.num_neighbors}, batch_size={self.batch_size}, "
            f"batches={len(self)}, features={sorted(self.features)}, graph={self.graph!r})"
        )

    # -- iteration -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Data]:
        epoch_seed = (
            resolve_seed(None) if self.random_seed is None else derive_seed(self.random_seed, (1 << 20) + self._epoch)
        )
        self._epoch += 1
        n = int(self.input_nodes.numel())
        if self.shuffle:
            gen = torch.Generator().manual_seed(epoch_seed & 0x7FFFFFFFFFFFFFFF)
            order = torch.randperm(n, generator=gen)
        else:
            order = torch.arange(n)
        batches = [order[i : i + self.batch_size] for i in range(0, n, self.batch_size)]
        if self.drop_last and batches and batches[-1].numel() < self.batch_size:
            batches.pop()
        if self.prefetch == 0 or self._collective_graph:
            return (self._finish(self._prepare(i, b, epoch_seed, True)) for i, b in enumerate(batches))
        return _Prefetcher(self, batches, epoch_seed)

    def _prepare(self, index: int, input_id: torch.Tensor, epoch_seed: int, on_caller: bool) -> _Prepared:
        """Sample one batch and read the rows that may be read off the caller's thread."""
        seeds = self.input_nodes[input_id]
        sub = sample_subgraph(self.graph, seeds, self.num_neighbors, derive_seed(epoch_seed, index), self.weight_name)
        rows = {
            name: fetch_rows(f, sub.n_id)
            for name, f in self.features.items()
            if on_caller or not is_collective_feature(f)
        }
        edge_attr = None
        ef = self._edge_features
        if ef is not None and (on_caller or not is_collective(ef)):
            edge_attr = fetch_rows(ef, sub.e_id)
        return _Prepared(index, input_id, sub, rows, edge_attr)

    def _finish(self, p: _Prepared) -> Data:
        """The rest of the rows (Embeddings, NCCL tensors) on the caller's thread, and the Data."""
        sub = p.sub
        for name, f in self.features.items():
            if name not in p.rows:
                p.rows[name] = fetch_rows(f, sub.n_id)
        edge_attr = p.edge_attr
        if edge_attr is None and self._edge_features is not None:
            edge_attr = fetch_rows(self._edge_features, sub.e_id)
        data = Data(edge_index=sub.edge_index, num_nodes=int(sub.n_id.numel()))
        for name, rows in p.rows.items():
            data[name] = rows
        if edge_attr is not None:
            data.edge_attr = edge_attr
        data.n_id = sub.n_id
        data.e_id = sub.e_id
        data.input_id = p.input_id
        data.batch_size = int(p.input_id.numel())
        data.num_sampled_nodes = sub.num_sampled_nodes
        data.num_sampled_edges = sub.num_sampled_edges
        return data


_DONE = object()


def _put(q: queue.Queue[Any], stop: threading.Event, item: Any) -> bool:
    """Put unless asked to stop (waits for room in short steps so a stop is seen)."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _work(
    loader: NeighborLoader, batches: list[torch.Tensor], epoch_seed: int, q: queue.Queue[Any], stop: threading.Event
) -> None:
    """The worker thread: prepare every batch in order, then the end marker (or the error).
    It holds no reference to the iterator, so dropping the iterator stops it (``__del__``)."""
    try:
        for i, b in enumerate(batches):
            if stop.is_set() or not _put(q, stop, loader._prepare(i, b, epoch_seed, False)):
                return
    except BaseException as e:  # handed to the caller's thread by __next__
        _put(q, stop, e)
        return
    _put(q, stop, _DONE)


class _Prefetcher:
    """Iterator over one epoch: a worker thread prepares batches into a bounded queue."""

    def __init__(self, loader: NeighborLoader, batches: list[torch.Tensor], epoch_seed: int) -> None:
        self._loader = loader
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=loader.prefetch)
        self._stop = threading.Event()
        self._left = len(batches)
        self._thread = threading.Thread(
            target=_work,
            args=(loader, batches, epoch_seed, self._queue, self._stop),
            name="wholemem-neighbor-loader",
            daemon=True,
        )
        self._thread.start()

    def __iter__(self) -> _Prefetcher:
        return self

    def __next__(self) -> Data:
        if self._left == 0:
            self.close()
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("NeighborLoader: the sampling worker stopped without a result") from None
        if isinstance(item, BaseException):
            self.close()
            raise item
        if item is _DONE:  # pragma: no cover - _left reaches 0 first
            self.close()
            raise StopIteration
        self._left -= 1
        return self._loader._finish(item)

    def __len__(self) -> int:
        return self._left

    def close(self) -> None:
        """Stop the worker (also when the epoch is abandoned half-way) and wait for it."""
        self._stop.set()
        while True:  # unblock a worker waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def __del__(self) -> None:
        self._stop.set()
