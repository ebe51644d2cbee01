"""Neighbour sampling and append_unique: exact results, statistics, reproducibility, bad input."""

from __future__ import annotations

import ctypes
import itertools
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import wholemem as wg
from wholemem import _graph_sample, _wholemem

T = wg.WmTensorType


def small_graph() -> wg.GraphStructure:
    """0 -> 1 2 3; 1 -> 2; 2 -> 0 3; 3 -> 0 1 2 3 4 5; 4 -> (none); 5 -> 0..5 (weights 1..)."""
    src = [0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 3, 3, *[5] * 6]
    dst = [1, 2, 3, 2, 0, 3, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]
    w = torch.arange(1, len(src) + 1, dtype=torch.float64)
    return wg.GraphStructure.from_edge_list(None, torch.tensor(src), torch.tensor(dst), 6, edge_weight=w)


def star(degree: int, weights: list[float] | None = None) -> wg.GraphStructure:
    """Node 0 with neighbours 1..degree (edge e -> node e + 1)."""
    dst = torch.arange(1, degree + 1)
    w = None if weights is None else torch.tensor(weights, dtype=torch.float64)
    return wg.GraphStructure.from_edge_list(
        None, torch.zeros(degree, dtype=torch.int64), dst, degree + 1, edge_weight=w
    )


@pytest.fixture
def threads() -> Iterator[None]:
    old = _wholemem.get_num_threads()
    yield
    _wholemem.set_num_threads(old)


# -- the random numbers ---------------------------------------------------------------


def test_philox_known_answers() -> None:
    # Random123's published Philox4x32-10 vectors
    assert _wholemem.philox4x32_10([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = 0xFFFFFFFF
    assert _wholemem.philox4x32_10([ones] * 4, [ones] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert _wholemem.philox4x32_10([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == [
        0xD16CFE09,
        0x94FDCCEB,
        0x5001E420,
        0x24126EA1,
    ]


# -- exact results ----------------------------------------------------------------------


def test_degree_at_most_max_returns_every_neighbour_in_order() -> None:
    g = small_graph()
    centers = torch.tensor([3, 0, 4, 1, 3])
    off, dest, lid, eid = wg.unweighted_sample_without_replacement(g, centers, 6, 11, True, True)
    assert off.dtype == torch.int32 and lid.dtype == torch.int32 and eid.dtype == torch.int64
    assert off.tolist() == [0, 6, 9, 9, 10, 16]
    assert dest.tolist() == [0, 1, 2, 3, 4, 5, 1, 2, 3, 2, 0, 1, 2, 3, 4, 5]
    assert lid.tolist() == [0] * 6 + [1] * 3 + [3] + [4] * 6
    assert eid.tolist() == [6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 6, 7, 8, 9, 10, 11]
    # weighted: the same when nothing has to be chosen
    woff, wdest, weid = wg.weighted_sample_without_replacement(g, centers, 6, 11, False, True)
    assert torch.equal(woff, off) and torch.equal(wdest, dest) and torch.equal(weid, eid)


def test_samples_are_distinct_neighbours_and_edge_ids_match() -> None:
    g = small_graph()
    centers = torch.tensor([3, 5, 0, 3, 5] * 20)
    for fn in (wg.unweighted_sample_without_replacement, wg.weighted_sample_without_replacement):
        off, dest, lid, eid = fn(g, centers, 4, 5, True, True)
        assert off.tolist() == [4 * i - (i + 2) // 5 for i in range(101)]  # center 0 has degree 3
        for i in range(centers.numel()):
            e = eid[off[i] : off[i + 1]]
            assert len(set(e.tolist())) == e.numel()  # without replacement
            c = int(centers[i])
            assert all(int(g.csr_row_ptr[c]) <= x < int(g.csr_row_ptr[c + 1]) for x in e.tolist())
            assert torch.equal(dest[off[i] : off[i + 1]], g.csr_col_ind[e])
            assert set(lid[off[i] : off[i + 1]].tolist()) <= {i}


def test_wholegraph_signature_and_return_layout() -> None:
    g = small_graph()
    c = torch.tensor([5, 3], dtype=torch.int32)
    by_graph = wg.unweighted_sample_without_replacement(g, c, 2, 9)
    by_arrays = wg.unweighted_sample_without_replacement(g.csr_row_ptr, g.csr_col_ind, c, 2, 9)
    by_kw = wg.unweighted_sample_without_replacement(
        wm_csr_row_ptr_tensor=g.csr_row_ptr,
        wm_csr_col_ptr_tensor=g.csr_col_ind,
        center_nodes_tensor=c,
        max_sample_count=2,
        random_seed=9,
    )
    by_method = g.unweighted_sample_without_replacement_one_hop(c, 2, random_seed=9)
    assert len(by_graph) == 2  # (offsets, dest) unless more is asked for, as WholeGraph
    for other in (by_arrays, by_kw, by_method):
        assert all(torch.equal(a, b) for a, b in zip(by_graph, other))
    w = wg.weighted_sample_without_replacement(g.csr_row_ptr, g.csr_col_ind, g.edge_weight, c, 2, 9, True, True)
    w2 = g.weighted_sample_without_replacement_one_hop("weight", c, 2, random_seed=9, need_center_local_output=True)
    assert len(w) == 4 and len(w2) == 3
    assert all(torch.equal(a, b) for a, b in zip(w, w2))


def test_zero_weights_are_taken_last() -> None:
    g = star(5, [0.0, 1.0, 0.0, 2.0, 0.0])
    centers = torch.zeros(200, dtype=torch.int64)
    _, dest = wg.weighted_sample_without_replacement(g, centers, 2, 3)
    assert all(set(pair) == {2, 4} for pair in dest.view(-1, 2).tolist())
    _, dest = wg.weighted_sample_without_replacement(g, centers, 3, 3)
    for triple in dest.view(-1, 3).tolist():
        assert {2, 4} < set(triple) and len(set(triple)) == 3


def test_empty_and_isolated_centers() -> None:
    g = small_graph()
    off, dest, eid = wg.unweighted_sample_without_replacement(g, torch.empty(0, dtype=torch.int64), 3, 1, False, True)
    assert off.tolist() == [0] and dest.numel() == 0 and eid.numel() == 0
    off, dest = wg.weighted_sample_without_replacement(g, torch.tensor([4, 4]), 3, 1)
    assert off.tolist() == [0, 0, 0] and dest.numel() == 0
    assert dest.dtype == g.csr_col_ind.dtype


# -- statistics (fixed seeds: the statistics below are deterministic) ------------------

# chi-square critical values at p = 0.001 for the degrees of freedom used below
_CHI2_999 = {4: 18.467, 5: 20.515, 9: 27.877, 19: 43.820}


def chi_square(counts: Counter[Any], expected: dict[Any, float]) -> float:
    assert set(counts) <= set(expected), f"impossible outcomes: {set(counts) - set(expected)}"
    return sum((counts.get(k, 0) - e) ** 2 / e for k, e in expected.items())


def test_unweighted_is_uniform_over_subsets() -> None:
    g = star(6)
    n = 12_000
    off, dest = wg.unweighted_sample_without_replacement(g, torch.zeros(n, dtype=torch.int64), 3, 2024)
    assert off[-1] == 3 * n
    counts = Counter(tuple(sorted(t)) for t in dest.view(n, 3).tolist())
    subsets = list(itertools.combinations(range(1, 7), 3))
    stat = chi_square(counts, {s: n / len(subsets) for s in subsets})
    assert stat < _CHI2_999[19], stat
    # every neighbour is in a sample with probability k / degree = 1 / 2
    per_node = Counter(dest.tolist())
    stat1 = chi_square(per_node, {v: n * 3 / 6 for v in range(1, 7)})
    assert stat1 < _CHI2_999[5], stat1


def test_weighted_one_draw_is_proportional_to_weight() -> None:
    weights = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    g = star(10, weights)
    n = 20_000
    _, dest = wg.weighted_sample_without_replacement(g, torch.zeros(n, dtype=torch.int64), 1, 77)
    total = sum(weights)
    stat = chi_square(Counter(dest.tolist()), {v + 1: n * w / total for v, w in enumerate(weights)})
    assert stat < _CHI2_999[9], stat


def test_weighted_pairs_follow_successive_sampling() -> None:
    weights = [1.0, 2.0, 4.0, 8.0, 0.5]
    g = star(5, weights)
    n = 20_000
    _, dest = wg.weighted_sample_without_replacement(g, torch.zeros(n, dtype=torch.int64), 2, 5)
    total = sum(weights)
    expected = {}
    for a, b in itertools.combinations(range(5), 2):
        wa, wb = weights[a], weights[b]
        p = wa / total * wb / (total - wa) + wb / total * wa / (total - wb)
        expected[(a + 1, b + 1)] = n * p
    stat = chi_square(Counter(tuple(sorted(p)) for p in dest.view(n, 2).tolist()), expected)
    assert stat < 29.588, stat  # chi-square, 9 degrees of freedom, p = 0.0005
    assert math.isclose(sum(expected.values()), n)


# -- reproducibility ----------------------------------------------------------------------


def random_graph(n: int = 300, e: int = 6000, seed: int = 0) -> wg.GraphStructure:
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    w = torch.rand(e, generator=gen, dtype=torch.float64)
    return wg.GraphStructure.from_edge_list(None, src, dst, n, edge_weight=w)


def all_outputs(g: Any, centers: torch.Tensor, k: int, seed: int | None) -> list[torch.Tensor]:
    u = wg.unweighted_sample_without_replacement(g, centers, k, seed, True, True)
    w = wg.weighted_sample_without_replacement(g, centers, k, seed, True, True)
    return [*u, *w]


def test_same_seed_same_sample_for_any_thread_count(threads: None) -> None:
    g = random_graph()
    centers = torch.randint(0, 300, (5000,), generator=torch.Generator().manual_seed(1))
    _wholemem.set_num_threads(1)
    one = all_outputs(g, centers, 7, 123)
    for n in (2, 3, 8):
        _wholemem.set_num_threads(n)
        assert all(torch.equal(a, b) for a, b in zip(one, all_outputs(g, centers, 7, 123)))
    other = all_outputs(g, centers, 7, 124)
    assert not torch.equal(one[1], other[1]) and not torch.equal(one[5], other[5])


def test_unseeded_calls_follow_torch_manual_seed() -> None:
    g = random_graph()
    centers = torch.arange(300)
    torch.manual_seed(5)
    a = all_outputs(g, centers, 3, None)
    torch.manual_seed(5)
    b = all_outputs(g, centers, 3, None)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert _graph_sample.resolve_seed(2**64 - 1) == (2**64 - 1)


@pytest.mark.parametrize("tensor_type", [T.HOST, T.CHUNKED, T.NCCL])
def test_every_tensor_type_samples_alike(comm: wg.WholeMemoryCommunicator, tensor_type: wg.WmTensorType) -> None:
    ref = random_graph()
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 300, (6000,), generator=gen), torch.randint(0, 300, (6000,), generator=gen)
    w = torch.rand(6000, generator=gen, dtype=torch.float64)
    g = wg.GraphStructure.from_edge_list(comm, src, dst, 300, edge_weight=w, tensor_type=tensor_type)
    assert g.tensor_type == tensor_type.name
    centers = torch.randint(0, 300, (2000,), generator=gen)
    for k in (1, 5, 40):
        assert all(torch.equal(a, b) for a, b in zip(all_outputs(ref, centers, k, 99), all_outputs(g, centers, k, 99)))


class CpuDeviceOps(_graph_sample.DeviceOps):
    """The GPU path's two device steps done by the CPU code (the kernels run the same
    per-center code), to exercise the GPU driver's logic on a machine without a GPU."""

    calls = 0

    def counts(self, a: Any, device: torch.device) -> None:
        CpuDeviceOps.calls += 1
        _wholemem.csr_sample_offsets(a)  # writes the prefix sum; the kernel writes the counts
        off = torch.frombuffer((ctypes.c_int32 * (a.n + 1)).from_address(a.offsets), dtype=torch.int32)
        off[1:] = off[1:] - off[:-1].clone()

    def fill(self, a: Any, device: torch.device) -> None:
        CpuDeviceOps.calls += 1
        _wholemem.csr_sample_fill(a)


def test_gpu_driver_logic_on_cpu_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    g = random_graph()
    centers = torch.randint(0, 300, (1000,), generator=torch.Generator().manual_seed(3))
    ref = all_outputs(g, centers, 6, 42)
    old = _graph_sample.set_device_ops(CpuDeviceOps())
    try:
        # pretend the CPU is the device the arrays and the centers live on
        monkeypatch.setattr(_graph_sample, "_on_gpu", lambda device: True)
        got = all_outputs(g, centers, 6, 42)
    finally:
        _graph_sample.set_device_ops(old)
    assert CpuDeviceOps.calls >= 4
    assert all(torch.equal(a, b) for a, b in zip(ref, got))


# -- append_unique ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_append_unique_wholegraph_example(dtype: torch.dtype) -> None:
    t = torch.tensor([3, 11, 2, 10], dtype=dtype)
    nb = torch.tensor([4, 5, 2, 11, 6, 9, 10, 5], dtype=dtype)
    unique, mapping = wg.append_unique(t, nb, need_neighbor_raw_to_unique=True)
    assert unique.dtype == dtype and mapping.dtype == torch.int32
    assert unique.tolist() == [3, 11, 2, 10, 4, 5, 6, 9]
    assert mapping.tolist() == [4, 5, 2, 1, 6, 7, 3, 5]
    assert torch.equal(wg.append_unique(t, nb), unique)
    assert torch.equal(unique[mapping.long()], nb)


def test_append_unique_native_equals_torch_ops() -> None:
    gen = torch.Generator().manual_seed(0)
    for nt, nn, hi in ((0, 0, 5), (0, 50, 20), (30, 0, 40), (100, 5000, 3000), (7, 9, 2**40)):
        t = torch.randint(0, hi, (nt,), generator=gen).unique()
        t = t[torch.randperm(t.numel(), generator=gen)]
        nb = torch.randint(0, hi, (nn,), generator=gen)
        a, ma = wg.append_unique(t, nb, True)
        b, mb = _graph_sample.append_unique_torch(t, nb)
        assert torch.equal(a, b) and torch.equal(ma, mb)
        assert torch.equal(a[: t.numel()], t) and a.unique().numel() == a.numel()
        assert torch.equal(a[ma.long()], nb)


def test_append_unique_repeated_targets_keep_their_places() -> None:
    t = torch.tensor([7, 3, 7])
    unique, mapping = wg.append_unique(t, torch.tensor([7, 1, 3, 1, -4]), True)
    assert unique.tolist() == [7, 3, 7, 1, -4] and mapping.tolist() == [0, 3, 1, 3, 4]
    b, mb = _graph_sample.append_unique_torch(t, torch.tensor([7, 1, 3, 1, -4]))
    assert torch.equal(unique, b) and torch.equal(mapping, mb)


# -- bad input --------------------------------------------------------------------------


def test_bad_centers() -> None:
    g = small_graph()
    f = wg.unweighted_sample_without_replacement
    with pytest.raises(IndexError, match=r"center_nodes\[1\] = 6 is out of range \[0, 6\)"):
        f(g, torch.tensor([0, 6]), 2)
    with pytest.raises(IndexError, match=r"center_nodes\[2\] = -1 is negative"):
        f(g, torch.tensor([0, 1, -1], dtype=torch.int32), 2)
    with pytest.raises(IndexError, match=r"center_nodes\[0\] = -2147483648"):
        wg.weighted_sample_without_replacement(g, torch.tensor([-(2**31)], dtype=torch.int32), 2)
    for bad, exc in (
        (torch.tensor([0.0]), TypeError),
        (torch.tensor([0], dtype=torch.uint8), TypeError),
        (torch.tensor([True]), TypeError),
        (torch.tensor([[0]]), ValueError),
        ([0, 1], TypeError),
        (torch.zeros(2, dtype=torch.int64, device="meta"), ValueError),
    ):
        with pytest.raises(exc):
            f(g, bad, 2)


def test_bad_max_sample_count_and_seed() -> None:
    g = small_graph()
    c = torch.tensor([0])
    for fn in (wg.unweighted_sample_without_replacement, wg.weighted_sample_without_replacement):
        for k in (0, -1):
            with pytest.raises(ValueError, match="max_sample_count must be > 0"):
                fn(g, c, k)
        for k in (2.0, True, "3", None):
            with pytest.raises(TypeError, match="max_sample_count"):
                fn(g, c, k)
        with pytest.raises(ValueError, match="random_seed"):
            fn(g, c, 2, -1)
        with pytest.raises(ValueError, match="random_seed"):
            fn(g, c, 2, 2**64)
        with pytest.raises(TypeError, match="random_seed"):
            fn(g, c, 2, 1.5)


def test_bad_arrays_and_arguments() -> None:
    g = small_graph()
    rp, col, w = g.csr_row_ptr, g.csr_col_ind, g.edge_weight
    c = torch.tensor([0])
    f = wg.unweighted_sample_without_replacement
    with pytest.raises(TypeError, match="csr_row_ptr must have dtype int64"):
        f(rp.int(), col, c, 2)
    with pytest.raises(TypeError, match="csr_col_ind must have dtype int32 or int64"):
        f(rp, col.float(), c, 2)
    with pytest.raises(TypeError, match="wholemem tensor or a torch.Tensor"):
        f(rp.tolist(), col, c, 2)
    with pytest.raises(ValueError, match="must be 1-D"):
        f(rp[:, None], col, c, 2)
    with pytest.raises(ValueError, match="contiguous"):
        f(rp, torch.stack([col, col], 1)[:, 0], c, 2)
    with pytest.raises(TypeError, match="csr_weight_ptr must have dtype float32 or float64"):
        wg.weighted_sample_without_replacement(rp, col, w.half(), c, 2)
    with pytest.raises(ValueError, match="csr_weight_ptr has 17 entries"):
        wg.weighted_sample_without_replacement(rp, col, w[:-1], c, 2)
    with pytest.raises(TypeError, match="unexpected keyword"):
        f(g, c, 2, bogus=1)
    with pytest.raises(TypeError, match="missing a required argument"):
        f(g, c)
    with pytest.raises(KeyError, match="weights"):
        wg.weighted_sample_without_replacement(g, c, 2, weight_name="nope")
    with pytest.raises(KeyError):
        g.weighted_sample_without_replacement_one_hop("nope", c, 2)
    with pytest.raises(RuntimeError, match="no CSR graph"):
        f(wg.GraphStructure(), c, 2)


def test_corrupt_row_pointer_never_reads_out_of_bounds() -> None:
    # validate=False skips the content check; the native pass still refuses bad ranges
    g = wg.GraphStructure()
    g.set_csr_graph(torch.tensor([0, 5, 2, 3]), torch.tensor([0, 1, 2]), validate=False)
    with pytest.raises(ValueError, match=r"corrupt CSR row pointer.*center_nodes\[1\]"):
        wg.unweighted_sample_without_replacement(g, torch.tensor([2, 0]), 2)


def test_append_unique_bad_input() -> None:
    a = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="one dtype"):
        wg.append_unique(a, a.int())
    with pytest.raises(TypeError, match="int32 or int64"):
        wg.append_unique(a.float(), a.float())
    with pytest.raises(TypeError, match="torch.Tensor"):
        wg.append_unique([1, 2], a)
    with pytest.raises(ValueError, match="1-D"):
        wg.append_unique(a[:, None], a)
    with pytest.raises(ValueError, match="one device"):
        wg.append_unique(a, a.to("meta"))
    with pytest.raises(ValueError, match="CPU or a CUDA device"):
        wg.append_unique(a.to("meta"), a.to("meta"))
