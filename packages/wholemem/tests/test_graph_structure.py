"""GraphStructure: building from edge lists, content checks, attributes, files (one process)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import wholemem as wg

T = wg.WmTensorType


def reference_csr(
    src: list[int],
    dst: list[int],
    n: int,
    attrs: list[float],
    *,
    reverse: bool = False,
    drop_loops: bool = False,
    add_loops: bool = False,
    dedupe: bool = False,
) -> tuple[list[int], list[int], list[float]]:
    """The documented order in plain Python: (src, dst, original < reverse < added loop, input order)."""
    edges = [(s, d, 0, i, a) for i, (s, d, a) in enumerate(zip(src, dst, attrs))]
    if reverse:
        edges += [(d, s, 1, i, a) for i, (s, d, a) in enumerate(zip(src, dst, attrs))]
    if drop_loops or add_loops:
        edges = [e for e in edges if e[0] != e[1]]
    if add_loops:
        edges += [(v, v, 2, 0, 1.0) for v in range(n)]
    edges.sort(key=lambda e: (e[0], e[1], e[2], e[3]))
    if dedupe:
        seen, kept = set(), []
        for e in edges:
            if (e[0], e[1]) not in seen:
                seen.add((e[0], e[1]))
                kept.append(e)
        edges = kept
    row_ptr = [0] * (n + 1)
    for e in edges:
        row_ptr[e[0] + 1] += 1
    for v in range(n):
        row_ptr[v + 1] += row_ptr[v]
    return row_ptr, [e[1] for e in edges], [e[4] for e in edges]


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"reverse": True},
        {"drop_loops": True},
        {"add_loops": True, "dedupe": True},
        {"reverse": True, "dedupe": True, "drop_loops": True},
    ],
)
def test_from_edge_list_matches_reference(flags: dict[str, bool]) -> None:
    gen = torch.Generator().manual_seed(1)
    n, e = 40, 300
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    w = torch.rand(e, generator=gen, dtype=torch.float64)
    feats = torch.stack([w * 2, w * 3], 1).float()
    g = wg.GraphStructure.from_edge_list(
        None,
        src,
        dst,
        n,
        edge_weight=w,
        edge_features=feats,
        add_reverse_edges=flags.get("reverse", False),
        remove_self_loops=flags.get("drop_loops", False),
        add_self_loops=flags.get("add_loops", False),
        remove_duplicates=flags.get("dedupe", False),
    )
    rp, col, attrs = reference_csr(src.tolist(), dst.tolist(), n, w.tolist(), **flags)
    assert g.csr_row_ptr.tolist() == rp and g.csr_col_ind.tolist() == col
    assert g.row_ptr is g.csr_row_ptr and g.col_idx is g.csr_col_ind  # the names
    assert g.edge_weight.tolist() == attrs
    exp_feat = torch.tensor(attrs, dtype=torch.float64)
    if flags.get("add_loops"):
        loops = torch.tensor([c == v for v in range(n) for c in col[rp[v] : rp[v + 1]]])
        exp_feat = torch.where(loops, torch.zeros(()), exp_feat)
    assert torch.equal(g.edge_features, torch.stack([exp_feat * 2, exp_feat * 3], 1).float())
    assert (g.node_count, g.edge_count) == (n, len(col))


@pytest.mark.parametrize("tensor_type", [T.HOST, T.CHUNKED, T.NCCL])
@pytest.mark.parametrize("col_dtype", [torch.int32, torch.int64])
def test_shared_types_equal_private_build(
    comm: wg.WholeMemoryCommunicator, tensor_type: wg.WmTensorType, col_dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(2)
    src, dst = torch.randint(0, 50, (400,), generator=gen), torch.randint(0, 50, (400,), generator=gen)
    ref = wg.GraphStructure.from_edge_list(None, src, dst, 50, add_reverse_edges=True, remove_duplicates=True)
    g = wg.GraphStructure.from_edge_list(
        comm,
        src.numpy(),
        dst.int(),
        50,
        tensor_type=tensor_type,
        col_dtype=col_dtype,
        add_reverse_edges=True,
        remove_duplicates=True,
    )
    assert g.comm is comm and g.tensor_type == tensor_type.name and g.csr_col_ind.dtype == col_dtype
    all_rows = torch.arange(51)
    assert torch.equal(wg.gather(g.csr_row_ptr, all_rows), ref.csr_row_ptr)
    assert torch.equal(wg.gather(g.csr_col_ind, torch.arange(g.edge_count)).long(), ref.csr_col_ind)


def test_empty_graphs(comm: wg.WholeMemoryCommunicator) -> None:
    g = wg.GraphStructure.from_edge_list(comm, torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64), 3)
    assert g.csr_row_ptr.tolist() == [0, 0, 0, 0] and g.edge_count == 0
    off, dest = wg.unweighted_sample_without_replacement(g, torch.tensor([2, 0]), 4)
    assert off.tolist() == [0, 0, 0] and dest.numel() == 0
    g0 = wg.GraphStructure.from_edge_list(None, torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64), 0)
    assert g0.node_count == 0 and g0.csr_row_ptr.tolist() == [0]


def test_set_csr_graph_checks_content() -> None:
    g = wg.GraphStructure()
    col = torch.tensor([1, 0, 2])
    with pytest.raises(ValueError, match=r"csr_row_ptr\[0\] must be 0"):
        g.set_csr_graph(torch.tensor([1, 2, 3, 3]), col)
    with pytest.raises(ValueError, match=r"must not decrease: csr_row_ptr\[2\] = 1 < csr_row_ptr\[1\] = 2"):
        g.set_csr_graph(torch.tensor([0, 2, 1, 3]), col)
    with pytest.raises(ValueError, match=r"csr_row_ptr\[3\] must equal the number of edges 3"):
        g.set_csr_graph(torch.tensor([0, 1, 2, 2]), col)
    with pytest.raises(IndexError, match=r"csr_col_ind\[2\] = 3 is out of range \[0, 3\)"):
        g.set_csr_graph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3]))
    with pytest.raises(IndexError, match=r"csr_col_ind\[0\] = -1"):
        g.set_csr_graph(torch.tensor([0, 1, 2, 3]), torch.tensor([-1, 0, 2], dtype=torch.int32))
    with pytest.raises(TypeError, match="csr_row_ptr must have dtype int64"):
        g.set_csr_graph(torch.tensor([0, 1, 2, 3], dtype=torch.int32), col)
    with pytest.raises(TypeError, match="csr_col_ind must have dtype int32 or int64"):
        g.set_csr_graph(torch.tensor([0, 1, 2, 3]), col.float())
    with pytest.raises(ValueError, match="at least one entry"):
        g.set_csr_graph(torch.empty(0, dtype=torch.int64), col)
    with pytest.raises(ValueError, match="csr_row_ptr is on cpu, csr_col_ind on meta"):
        g.set_csr_graph(torch.tensor([0, 1, 2, 3]), col.to("meta"), validate=False)
    assert g.csr_row_ptr is None  # nothing was set by the failures
    g.set_csr_graph(torch.tensor([0, 1, 2, 3]), col)
    assert (g.node_count, g.edge_count, g.tensor_type) == (3, 3, "private")


def test_csr_check_on_wholemem_tensors(comm: wg.WholeMemoryCommunicator) -> None:
    for ty in (T.HOST, T.CHUNKED, T.NCCL):
        rp = wg.create_wm_tensor(comm, [4], [], torch.int64, ty)
        col = wg.create_wm_tensor(comm, [3], [], torch.int64, ty)
        wg.scatter(rp, torch.arange(4), torch.tensor([0, 3, 2, 3]))
        with pytest.raises(ValueError, match="must not decrease"):
            wg.GraphStructure().set_csr_graph(rp, col)
        wg.scatter(rp, torch.arange(4), torch.tensor([0, 1, 2, 3]))
        g = wg.GraphStructure()
        g.set_csr_graph(rp, col)
        assert g.comm is comm


def test_attributes() -> None:
    g = wg.GraphStructure.from_edge_list(None, torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    g.set_node_attribute("feat", torch.zeros(3, 4))
    g.set_edge_attribute("weight", torch.tensor([0.5, 2.0]))
    g.set_edge_attribute("kind", torch.tensor([[1], [2]]))
    assert sorted(g.node_attributes) == ["feat"] and g.edge_weight.tolist() == [0.5, 2.0]
    with pytest.raises(ValueError, match="already set"):
        g.set_node_attribute("feat", torch.zeros(3))
    with pytest.raises(ValueError, match="must have 3 rows"):
        g.set_node_attribute("x", torch.zeros(2))
    with pytest.raises(ValueError, match="identifiers"):
        g.set_node_attribute("../x", torch.zeros(3))
    with pytest.raises(TypeError, match="wholemem tensor or a torch.Tensor"):
        g.set_edge_attribute("y", [1, 2])
    g2 = wg.GraphStructure.from_edge_list(None, torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    with pytest.raises(ValueError, match=r"finite and >= 0, got -1.0 at edge 1"):
        g2.set_edge_attribute("weight", torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="finite"):
        g2.set_edge_attribute("weight", torch.tensor([float("nan"), 1.0]))
    with pytest.raises(TypeError, match="1-D float32 or float64"):
        g2.set_edge_attribute("weight", torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="set the CSR graph"):
        wg.GraphStructure().set_node_attribute("x", torch.zeros(1))


def test_from_edge_list_bad_input(comm: wg.WholeMemoryCommunicator) -> None:
    s, d = torch.tensor([0, 1]), torch.tensor([1, 2])
    f = wg.GraphStructure.from_edge_list
    with pytest.raises(IndexError, match=r"dst\[1\] = 2 is out of range \[0, 2\)"):
        f(comm, s, d, 2)
    with pytest.raises(IndexError, match=r"src\[0\] = -1 is negative"):
        f(None, torch.tensor([-1, 0]), d, 3)
    with pytest.raises(TypeError, match="src must be an integer array"):
        f(None, s.float(), d, 3)
    with pytest.raises(ValueError, match="same length"):
        f(None, s, d[:1], 3)
    with pytest.raises(ValueError, match="num_nodes must be >= 0"):
        f(None, s, d, -3)
    with pytest.raises(TypeError, match="num_nodes must be an int"):
        f(None, s, d, 3.0)
    with pytest.raises(ValueError, match=r"edge_weight\[1\] = inf must be finite"):
        f(None, s, d, 3, edge_weight=torch.tensor([1.0, float("inf")]))
    with pytest.raises(TypeError, match="edge_weight must have dtype float32 or float64"):
        f(None, s, d, 3, edge_weight=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"edge_weight must have shape \(2,\)"):
        f(None, s, d, 3, edge_weight=torch.ones(3))
    with pytest.raises(ValueError, match="edge_features must have shape"):
        f(None, s, d, 3, edge_features=torch.ones(2))
    with pytest.raises(TypeError, match="tensor_type"):
        f(None, s, d, 3, tensor_type="HOST")
    with pytest.raises(TypeError, match="col_dtype"):
        f(None, s, d, 3, col_dtype=torch.float32)
    with pytest.raises(TypeError, match="comm must be"):
        f("world", s, d, 3)
    # the communicator is still usable after the failures above
    assert f(comm, s, d, 3).edge_count == 2


def test_multilayer_sample_is_pylibwholegraph_shaped() -> None:
    gen = torch.Generator().manual_seed(4)
    src, dst = torch.randint(0, 100, (1500,), generator=gen), torch.randint(0, 100, (1500,), generator=gen)
    g = wg.GraphStructure.from_edge_list(None, src, dst, 100, edge_weight=torch.rand(1500, generator=gen))
    seeds = torch.tensor([5, 17, 42])
    for weight in (None, "weight"):
        gids, edges, rps, cols = g.multilayer_sample_without_replacement(seeds, [4, 3], weight, random_seed=8)
        assert len(gids) == 3 and len(edges) == 2 and torch.equal(gids[2], seeds)
        for i in (1, 0):
            assert torch.equal(gids[i][: gids[i + 1].numel()], gids[i + 1])  # targets first
            nbr, center = edges[i].long()
            assert torch.equal(edges[i][0], cols[i]) and rps[i][-1] == nbr.numel()
            for a, b in zip(gids[i][nbr].tolist(), gids[i + 1][center].tolist()):
                nbrs = g.csr_col_ind[g.csr_row_ptr[b] : g.csr_row_ptr[b + 1]].tolist()
                assert a in nbrs  # every edge of the block is an edge of the graph
        again = g.multilayer_sample_without_replacement(seeds, [4, 3], weight, random_seed=8)
        assert all(torch.equal(a, b) for a, b in zip(gids, again[0]))


# -- files --------------------------------------------------------------------------------


def test_save_and_load(comm: wg.WholeMemoryCommunicator, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(6)
    src, dst = torch.randint(0, 30, (200,), generator=gen), torch.randint(0, 30, (200,), generator=gen)
    w, feats = torch.rand(200, generator=gen), torch.randn(200, 3, generator=gen)
    g = wg.GraphStructure.from_edge_list(comm, src, dst, 30, edge_weight=w, edge_features=feats, tensor_type=T.CHUNKED)
    g.set_node_attribute("label", wg.create_wm_tensor(comm, [30], [], torch.int64, T.CHUNKED))
    g.save(tmp_path / "g", num_parts=3)
    meta = json.loads((tmp_path / "g" / "graph.json").read_text())
    assert meta["node_count"] == 30 and sorted(meta["arrays"]) == [
        "col_idx",
        "edge_features",
        "edge_weight",
        "node_label",
        "row_ptr",
    ]
    for ty in (T.HOST, T.NCCL):
        h = wg.GraphStructure.load(comm, tmp_path / "g", tensor_type=ty)
        assert h.tensor_type == ty.name and sorted(h.edge_attributes) == ["features", "weight"]
        for a, b in (
            (g.csr_row_ptr, h.csr_row_ptr),
            (g.edge_features, h.edge_features),
            (g.edge_weight, h.edge_weight),
        ):
            idx = torch.arange(a.shape[0])
            assert torch.equal(wg.gather(a, idx), wg.gather(b, idx))
        c = torch.arange(30)
        assert all(
            torch.equal(x, y)
            for x, y in zip(
                wg.weighted_sample_without_replacement(g, c, 3, 1, True, True),
                wg.weighted_sample_without_replacement(h, c, 3, 1, True, True),
            )
        )
    with pytest.raises(TypeError, match="plain tensor"):
        wg.GraphStructure.from_edge_list(None, src, dst, 30).save(tmp_path / "private")


def test_load_refuses_bad_files(comm: wg.WholeMemoryCommunicator, tmp_path: Path) -> None:
    g = wg.GraphStructure.from_edge_list(comm, torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3, tensor_type=T.HOST)
    d = tmp_path / "g"
    g.save(d)
    meta_path = d / "graph.json"
    good = meta_path.read_text()
    with pytest.raises(FileNotFoundError, match="graph.json"):
        wg.GraphStructure.load(comm, tmp_path / "missing")
    meta_path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        wg.GraphStructure.load(comm, d)
    bad = json.loads(good)
    bad["arrays"]["row_ptr"]["dtype"] = "object"
    meta_path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="bad entry for array 'row_ptr'"):
        wg.GraphStructure.load(comm, d)
    bad = json.loads(good)
    bad["arrays"]["../../etc"] = {"dtype": "int64", "shape": [3]}
    meta_path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="bad entry"):
        wg.GraphStructure.load(comm, d)
    meta_path.write_text(good)
    part = sorted(d.glob("col_idx_*.bin"))[0]
    raw = part.read_bytes()
    part.write_bytes(raw[:-8])
    with pytest.raises(ValueError, match="bytes, expected"):
        wg.GraphStructure.load(comm, d)
    # a row pointer that would make the sampler read past the columns is refused
    part.write_bytes(raw)
    rp_part = sorted(d.glob("row_ptr_*.bin"))[0]
    vals = np.frombuffer(rp_part.read_bytes(), dtype=np.int64).copy()
    vals[1] = 99
    rp_part.write_bytes(vals.tobytes())
    with pytest.raises(ValueError, match="csr_row_ptr"):
        wg.GraphStructure.load(comm, d)


def test_from_wholegraph_files(comm: wg.WholeMemoryCommunicator, tmp_path: Path) -> None:
    rp = np.array([0, 2, 3, 3, 5], dtype=np.int64)
    col = np.array([1, 3, 0, 2, 1], dtype=np.int32)
    w = np.array([1, 2, 3, 4, 5], dtype=np.float32)
    (tmp_path / "row_ptr").write_bytes(rp.tobytes())
    for i, chunk in enumerate(np.array_split(col, 2)):  # WholeGraph's <prefix>_part_<i>_of_<n>
        (tmp_path / f"col_part_{i}_of_2").write_bytes(chunk.tobytes())
    (tmp_path / "w").write_bytes(w.tobytes())
    g = wg.GraphStructure.from_files(
        comm, tmp_path / "row_ptr", tmp_path / "col", col_dtype=torch.int32, edge_weight_file=tmp_path / "w"
    )
    assert g.tensor_type == "CHUNKED" and (g.node_count, g.edge_count) == (4, 5)
    assert wg.gather(g.csr_col_ind, torch.arange(5)).tolist() == col.tolist()
    off, dest = wg.unweighted_sample_without_replacement(g, torch.tensor([0, 3]), 5, 0)
    assert off.tolist() == [0, 2, 4] and dest.tolist() == [1, 3, 2, 1]
    (tmp_path / "bad_rp").write_bytes(np.array([0, 2, 9, 3, 5], dtype=np.int64).tobytes())
    with pytest.raises(ValueError, match="csr_row_ptr"):
        wg.GraphStructure.from_files(comm, tmp_path / "bad_rp", tmp_path / "col", col_dtype=torch.int32)
    with pytest.raises(FileNotFoundError):
        wg.GraphStructure.from_files(comm, tmp_path / "nothing", tmp_path / "col")
    with pytest.raises(TypeError, match="weight_dtype"):
        wg.GraphStructure.from_files(comm, tmp_path / "row_ptr", tmp_path / "col", weight_dtype=torch.int32)


def test_view_and_multilayer_bad_input(comm: wg.WholeMemoryCommunicator) -> None:
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
    private = wg.GraphStructure.from_edge_list(None, src, dst, 3)
    assert private.view("cpu").csr_col_ind is private.csr_col_ind
    with pytest.raises(ValueError, match="no view on cuda"):
        private.view("cuda")
    shared = wg.GraphStructure.from_edge_list(comm, src, dst, 3, tensor_type=T.HOST)
    assert torch.equal(shared.view("cpu").csr_row_ptr, shared.csr_row_ptr)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="GPU"):
            shared.view("cuda")
    with pytest.raises(ValueError, match="max_sample_count must be > 0"):
        private.multilayer_sample_without_replacement(torch.tensor([0]), [2, 0])
    with pytest.raises(IndexError, match=r"center_nodes\[0\] = 3"):
        private.multilayer_sample_without_replacement(torch.tensor([3]), [2])
    with pytest.raises(KeyError, match="weight"):
        private.multilayer_sample_without_replacement(torch.tensor([0]), [2], "weight")
    with pytest.raises(RuntimeError, match="no CSR graph"):
        wg.GraphStructure().multilayer_sample_without_replacement(torch.tensor([0]), [2])
