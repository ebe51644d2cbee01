"""wholemem.pyg: feature / graph stores and the neighbour loader (one process)."""

from __future__ import annotations

import gc
import threading
import time
import warnings
from typing import Any

import pytest
import torch

import wholemem as wg
from wholemem._graph import derive_seed

pyg = pytest.importorskip("wholemem.pyg", reason="torch-geometric (wholemem[pyg]) is not installed")
from torch_geometric.data import Data  # noqa: E402  (after the import above filtered PyG's import warnings)
from torch_geometric.loader.utils import filter_custom_store  # noqa: E402
from torch_geometric.nn import SAGEConv  # noqa: E402

T = wg.WmTensorType


def random_graph(n: int = 120, e: int = 900, seed: int = 0) -> wg.GraphStructure:
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    return wg.GraphStructure.from_edge_list(
        None, src, dst, n, edge_weight=torch.rand(e, generator=gen), add_reverse_edges=True, remove_duplicates=True
    )


def reference_subgraph(g: wg.GraphStructure, seeds: list[int], fanouts: list[int], seed: int) -> dict[str, Any]:
    """PyG's NeighborLoader rule in plain Python: hop h samples the nodes new at hop h - 1,
    new nodes are numbered in order of first appearance, edges point neighbour -> center."""
    nodes, index = list(seeds), {}
    for i, v in enumerate(seeds):
        index.setdefault(v, i)
    rows, cols, eids, counts = [], [], [], [len(seeds)]
    frontier = range(len(seeds))
    for hop, k in enumerate(fanouts):
        centers = torch.tensor([nodes[i] for i in frontier], dtype=torch.int64)
        off, dest, eid = wg.unweighted_sample_without_replacement(g, centers, k, derive_seed(seed, hop), False, True)
        start = len(nodes)
        for j, i in enumerate(frontier):
            for q in range(int(off[j]), int(off[j + 1])):
                v = int(dest[q])
                if v not in index:
                    index[v] = len(nodes)
                    nodes.append(v)
                rows.append(index[v])
                cols.append(i)
                eids.append(int(eid[q]))
        counts.append(len(nodes) - start)
        frontier = range(start, len(nodes))
    return {"n_id": nodes, "edge_index": [rows, cols], "e_id": eids, "num_sampled_nodes": counts}


def test_sample_subgraph_follows_pyg_order() -> None:
    g = random_graph()
    for seeds, fanouts in (([5, 77, 3], [4, 3]), ([0], [2, 2, 2]), (list(range(30)), [5])):
        sub = pyg.sample_subgraph(g, torch.tensor(seeds), fanouts, 1234)
        ref = reference_subgraph(g, seeds, fanouts, 1234)
        assert sub.n_id.tolist() == ref["n_id"]
        assert sub.edge_index.tolist() == ref["edge_index"]
        assert sub.e_id.tolist() == ref["e_id"] and sub.num_sampled_nodes == ref["num_sampled_nodes"]
        assert sub.n_id.dtype == torch.int64 and sub.edge_index.dtype == torch.int64


def test_full_fanout_by_hand() -> None:
    # messages flow along the PyG edges j -> v; the graph lists, for each v, its sources j
    edge_index = torch.tensor([[1, 2, 3, 3, 0, 4], [0, 0, 1, 2, 2, 3]])
    gs = pyg.WholeGraphStore()
    gs.put_edge_index((edge_index[0], edge_index[1]), edge_type=None, layout="coo", size=(5, 5))
    loader = pyg.NeighborLoader(gs, torch.arange(5.0)[:, None], [-1, -1], batch_size=1, input_nodes=[0])
    b = next(iter(loader))
    assert b.n_id.tolist() == [0, 1, 2, 3]
    assert b.edge_index.tolist() == [[1, 2, 3, 0, 3], [0, 0, 1, 2, 2]]  # a center's sources in id order
    assert b.num_sampled_nodes == [1, 2, 1] and b.num_sampled_edges == [2, 3]
    assert b.x.flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert b.batch_size == 1 and b.input_id.tolist() == [0]
    # every sampled edge is an edge of the PyG graph, in its direction
    edges = set(map(tuple, edge_index.t().tolist()))
    assert {(int(b.n_id[s]), int(b.n_id[d])) for s, d in b.edge_index.t().tolist()} <= edges


def test_loader_batches_are_pyg_data() -> None:
    g = random_graph()
    x, y = torch.randn(120, 6), torch.randint(0, 4, (120,))
    g.set_edge_attribute("features", torch.randn(g.edge_count, 2))
    train = torch.zeros(120, dtype=torch.bool)
    train[::3] = True
    loader = pyg.NeighborLoader(g, {"x": x, "y": y}, [4, 2], batch_size=16, input_nodes=train, random_seed=3)
    assert len(loader) == 3
    conv = SAGEConv(6, 4)
    seen = []
    for b in loader:
        assert isinstance(b, Data)
        assert torch.equal(b.x, x[b.n_id]) and torch.equal(b.y, y[b.n_id])
        assert torch.equal(b.edge_attr, g.edge_features[b.e_id])
        assert torch.equal(b.n_id[: b.batch_size], torch.nonzero(train).flatten()[b.input_id])
        assert sum(b.num_sampled_nodes) == b.num_nodes and sum(b.num_sampled_edges) == b.edge_index.shape[1]
        # e_id names the sampled edge: the neighbour sits at that position of the center's list
        nbr, center = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
        assert torch.equal(g.csr_col_ind[b.e_id], nbr)
        assert bool(((g.csr_row_ptr[center] <= b.e_id) & (b.e_id < g.csr_row_ptr[center + 1])).all())
        out = conv(b.x, b.edge_index)[: b.batch_size]
        assert out.shape == (b.batch_size, 4)
        seen += b.n_id[: b.batch_size].tolist()
    assert sorted(seen) == torch.nonzero(train).flatten().tolist()


def batches(loader: Any) -> list[Data]:
    return list(loader)


def same(a: list[Data], b: list[Data]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.n_id, y.n_id) and torch.equal(x.edge_index, y.edge_index) and torch.equal(x.x, y.x)
        for x, y in zip(a, b)
    )


def test_prefetching_changes_nothing_and_seeds_reproduce() -> None:
    g = random_graph()
    x = torch.randn(120, 3)
    kw: dict[str, Any] = {"batch_size": 10, "shuffle": True, "random_seed": 11}
    eager = pyg.NeighborLoader(g, x, [3, 3], prefetch=0, **kw)
    ahead = pyg.NeighborLoader(g, x, [3, 3], prefetch=3, **kw)
    first = batches(eager)
    assert same(first, batches(ahead))
    second = batches(eager)
    assert same(second, batches(ahead))  # epoch 2 of both
    assert not same(first, second)  # a new shuffle and new samples every epoch
    eager.set_epoch(0)
    assert same(first, batches(eager))
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        eager.set_epoch(-1)
    weighted = pyg.NeighborLoader(g, x, [3, 3], weight_name="weight", prefetch=2, **kw)
    assert len(batches(weighted)) == 12
    dropped = pyg.NeighborLoader(g, x, [2], batch_size=50, drop_last=True)
    assert len(dropped) == 2 and [b.batch_size for b in dropped] == [50, 50]


def test_embedding_features_train(comm: wg.WholeMemoryCommunicator) -> None:
    g = random_graph()
    emb = wg.Embedding(comm, 120, 4, optimizer=wg.SGD(lr=0.5), tensor_type=T.CHUNKED)
    feats = wg.create_wm_tensor(comm, [120, 3], [], torch.float32, T.HOST)
    feats.copy_(torch.randn(120, 3))
    loader = pyg.NeighborLoader(g, {"x": feats, "emb": emb}, [3], batch_size=8, random_seed=0)
    b = next(iter(loader))
    assert b.emb.requires_grad and not b.x.requires_grad
    before = wg.gather(emb.weight, b.n_id).clone()
    b.emb.sum().backward()
    emb.step()
    after = wg.gather(emb.weight, b.n_id)
    assert torch.allclose(after, before - 0.5)  # n_id is unique: each row got a gradient of ones


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "wholemem-neighbor-loader"]


def test_abandoned_epoch_stops_its_worker() -> None:
    g = random_graph()
    assert loader_threads() == []
    loader = pyg.NeighborLoader(g, torch.randn(120, 2), [5, 5], batch_size=2, prefetch=2)
    it = iter(loader)
    next(it)
    assert len(loader_threads()) == 1
    del it  # dropped half-way through the epoch: the worker must not linger
    gc.collect()
    # the worker notices within one batch; the generous bound is for a machine under heavy load
    deadline = time.monotonic() + 60
    while loader_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loader_threads() == []


def test_worker_errors_reach_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    import wholemem.pyg._loader as loader_mod

    real = loader_mod.sample_subgraph
    calls = []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom in the sampler")
        return real(*args, **kwargs)

    monkeypatch.setattr(loader_mod, "sample_subgraph", flaky)
    loader = pyg.NeighborLoader(random_graph(), torch.randn(120, 2), [2], batch_size=40, prefetch=1)
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="boom in the sampler"):
        next(it)


def test_loader_bad_input() -> None:
    g = random_graph()
    x = torch.randn(120, 2)
    L = pyg.NeighborLoader
    with pytest.raises(TypeError, match="GraphStructure"):
        L("graph", x, [2])
    with pytest.raises(TypeError, match="num_neighbors"):
        L(g, x, "2")
    with pytest.raises(ValueError, match=r"num_neighbors\[1\] must be >= -1"):
        L(g, x, [2, -2])
    with pytest.raises(TypeError, match=r"num_neighbors\[0\] must be an int"):
        L(g, x, [2.5])
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        L(g, x, [2], batch_size=0)
    with pytest.raises(ValueError, match="prefetch must be >= 0"):
        L(g, x, [2], prefetch=-1)
    with pytest.raises(ValueError, match="has 119 rows, the graph 120 nodes"):
        L(g, x[:-1], [2])
    with pytest.raises(TypeError, match="feature 'x' must be"):
        L(g, [[0.0]] * 120, [2])
    with pytest.raises(IndexError, match=r"input_nodes\[1\] = 120 is out of range"):
        L(g, x, [2], input_nodes=torch.tensor([0, 120]))
    with pytest.raises(ValueError, match="mask must have shape"):
        L(g, x, [2], input_nodes=torch.ones(5, dtype=torch.bool))
    with pytest.raises(KeyError, match="weight_name"):
        L(g, x, [2], weight_name="w")
    with pytest.raises(ValueError, match="random_seed"):
        L(g, x, [2], random_seed=-5)


# -- stores -------------------------------------------------------------------------------


def test_feature_store_private_and_shared(comm: wg.WholeMemoryCommunicator) -> None:
    x = torch.randn(10, 3)
    fs = pyg.WholeFeatureStore()
    assert fs.put_tensor(x, group_name=None, attr_name="x", index=None)
    idx = torch.tensor([9, 0, 4])
    assert torch.equal(fs.get_tensor(None, "x", idx), x[idx])
    assert torch.equal(fs.get_tensor(None, "x", None), x)
    assert fs.get_tensor_size(None, "x") == (10, 3)
    assert [(a.group_name, a.attr_name) for a in fs.get_all_tensor_attrs()] == [(None, "x")]
    fs.put_tensor(torch.zeros(2, 3), group_name=None, attr_name="x", index=torch.tensor([1, 2]))
    assert fs.get_tensor(None, "x", torch.tensor([1, 2])).abs().sum() == 0
    assert fs.remove_tensor(None, "x", None) and fs.get_tensor_size(None, "x") is None

    shared = pyg.WholeFeatureStore(comm, tensor_type=T.CHUNKED)
    shared.put_tensor(x, group_name="paper", attr_name="x", index=None)  # collective: every rank its part
    stored = shared.get_tensor("paper", "x", None)
    assert wg.get_wm_tensor_type(stored) is T.CHUNKED
    assert torch.equal(shared.get_tensor("paper", "x", idx), x[idx])
    t = wg.create_wm_tensor(comm, [10, 2], [], torch.float64, T.NCCL)
    shared.put_tensor(t, group_name="paper", attr_name="y", index=None)  # by reference
    wg.scatter(t, torch.tensor([3]), torch.tensor([[1.5, 2.5]], dtype=torch.float64))
    assert shared.get_tensor("paper", "y", torch.tensor([3])).tolist() == [[1.5, 2.5]]
    emb = wg.Embedding(comm, 10, 4)
    shared.put_tensor(emb, group_name="paper", attr_name="emb", index=None)
    rows = shared.get_tensor("paper", "emb", torch.tensor([1, 1]))
    assert rows.requires_grad and shared.get_tensor_size("paper", "emb") == (10, 4)
    assert sorted(shared.features("paper")) == ["emb", "x", "y"] and shared.features(None) == {}
    # the multi-get PyG's loaders use
    got = shared.multi_get_tensor([("paper", "x", idx), ("paper", "y", idx)])
    assert torch.equal(got[0], x[idx]) and got[1].shape == (3, 2)


def test_feature_store_bad_input(comm: wg.WholeMemoryCommunicator) -> None:
    fs = pyg.WholeFeatureStore(comm)
    fs.put_tensor(torch.randn(5, 2), group_name=None, attr_name="x", index=None)
    with pytest.raises(IndexError, match=r"index\[1\] = 5 is out of range \[0, 5\)"):
        fs.get_tensor(None, "x", torch.tensor([0, 5]))
    with pytest.raises(TypeError, match="int32 or int64"):
        fs.get_tensor(None, "x", torch.tensor([0.0]))
    with pytest.raises(ValueError, match="1-D"):
        fs.get_tensor(None, "x", torch.tensor([[0]]))
    with pytest.raises(KeyError, match="existing attribute"):
        fs.put_tensor(torch.zeros(1, 2), group_name=None, attr_name="z", index=torch.tensor([0]))
    with pytest.raises(ValueError, match="without an index"):
        fs.put_tensor(wg.Embedding(comm, 5, 2), group_name=None, attr_name="e", index=torch.tensor([0]))
    with pytest.raises(TypeError, match="expected a tensor"):
        fs.put_tensor([1.0, 2.0], group_name=None, attr_name="l", index=None)
    with pytest.raises(ValueError, match="row dimension"):
        fs.put_tensor(torch.tensor(3.0), group_name=None, attr_name="s", index=None)
    with pytest.raises(TypeError, match="comm must be"):
        pyg.WholeFeatureStore("comm")
    assert fs.get_tensor(None, "missing", None) is None


def test_graph_store_layouts() -> None:
    g = random_graph()
    gs = pyg.WholeGraphStore(g)
    (attr,) = gs.get_all_edge_attrs()
    assert attr.edge_type is None and attr.layout.value == "csc" and attr.size == (120, 120)
    row, colptr, perm = gs.csc()
    assert row is g.csr_col_ind and colptr is g.csr_row_ptr and perm is None  # zero copy
    row2, col2, _ = gs.coo()
    assert torch.equal(row2, g.csr_col_ind) and torch.equal(
        col2, torch.repeat_interleave(torch.arange(120), g.csr_row_ptr.diff())
    )
    rowptr, col3, _ = gs.csr()
    assert rowptr[-1] == g.edge_count
    for s in range(120):  # CSR by source: s's targets are the centers whose lists hold s
        assert sorted(col3[rowptr[s] : rowptr[s + 1]].tolist()) == sorted(col2[row2 == s].tolist())
    # PyG edge indices in every layout become the same graph
    ei = torch.stack([row2, col2])
    for layout, pair in (("coo", (ei[0], ei[1])), ("csc", (row, colptr)), ("csr", (rowptr, col3))):
        other = pyg.WholeGraphStore()
        other.put_edge_index(pair, edge_type=("a", "to", "b"), layout=layout, size=(120, 120))
        h = other.graph(("a", "to", "b"))
        assert torch.equal(h.csr_row_ptr, g.csr_row_ptr)
        # within a center the order may differ (COO / CSR are re-sorted by source)
        for v in range(0, 120, 7):
            a = h.csr_col_ind[h.csr_row_ptr[v] : h.csr_row_ptr[v + 1]].sort().values
            assert torch.equal(a.long(), g.csr_col_ind[g.csr_row_ptr[v] : g.csr_row_ptr[v + 1]].sort().values)
    assert gs.remove_edge_index(edge_type=None, layout="csc") and gs.get_all_edge_attrs() == []
    with pytest.raises(KeyError):
        gs.graph(None)
    with pytest.raises(TypeError, match="pair of tensors"):
        gs.put_edge_index(torch.zeros(2, 3), edge_type=None, layout="coo")


def test_stores_work_with_pyg_helpers() -> None:
    g = random_graph()
    x = torch.randn(120, 5)
    fs, gs = pyg.WholeFeatureStore(), pyg.WholeGraphStore(g)
    fs.put_tensor(x, group_name=None, attr_name="x", index=None)
    b = next(iter(pyg.NeighborLoader(gs, fs, [3, 2], batch_size=4, random_seed=2)))
    d = filter_custom_store(fs, gs, b.n_id, b.edge_index[0], b.edge_index[1], None)
    assert torch.equal(d.x, b.x) and torch.equal(d.edge_index, b.edge_index)
    from torch_geometric.sampler import NeighborSampler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # PyG's "install pyg-lib" notice
        sampler = NeighborSampler((fs, gs), num_neighbors=[2])
    assert torch.equal(sampler.colptr, g.csr_row_ptr) and sampler.num_nodes == 120


def test_sample_subgraph_bad_input() -> None:
    g = random_graph()
    with pytest.raises(TypeError, match="seeds must be"):
        pyg.sample_subgraph(g, [1, 2], [2], 0)
    with pytest.raises(TypeError, match="seeds must be"):
        pyg.sample_subgraph(g, torch.tensor([1.0]), [2], 0)
    with pytest.raises(IndexError, match=r"center_nodes\[0\] = 500"):
        pyg.sample_subgraph(g, torch.tensor([500]), [2], 0)
    with pytest.raises(ValueError, match=r"num_neighbors\[0\] must be >= -1"):
        pyg.sample_subgraph(g, torch.tensor([1]), [-3], 0)
    with pytest.raises(KeyError, match="weight_name"):
        pyg.sample_subgraph(g, torch.tensor([1]), [2], 0, weight_name="w")
    with pytest.raises(ValueError, match="random_seed"):
        pyg.sample_subgraph(g, torch.tensor([1]), [2], -1)
    sub = pyg.sample_subgraph(g, torch.tensor([1, 2], dtype=torch.int32), [0, 3], 0)
    assert sub.num_sampled_nodes[:2] == [2, 0] and sub.num_sampled_edges == [0, 0]
