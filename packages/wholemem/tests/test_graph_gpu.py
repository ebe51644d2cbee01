"""Graph sampling on a real GPU against the CPU (``nox -s gpu``; skipped without one)."""

from __future__ import annotations

import pytest
import torch

import wholemem as wg
from wholemem import _wholemem

GPU = bool(_wholemem.cuda_compiled() and torch.cuda.is_available() and _wholemem.cuda_device_count() > 0)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and a wholemem build with nvcc (nox -s gpu)"),
]


def random_graph(comm: wg.WholeMemoryCommunicator) -> wg.GraphStructure:
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 2000, (40_000,), generator=gen), torch.randint(0, 2000, (40_000,), generator=gen)
    w = torch.rand(40_000, generator=gen, dtype=torch.float64)
    return wg.GraphStructure.from_edge_list(comm, src, dst, 2000, edge_weight=w, tensor_type=wg.WmTensorType.HOST)


def test_kernels_sample_as_the_cpu(comm: wg.WholeMemoryCommunicator) -> None:
    g = random_graph(comm)
    centers = torch.randint(0, 2000, (5000,), generator=torch.Generator().manual_seed(1))
    views = {
        "HOST mapped for the GPU": g.view("cuda"),
        "device copies": wg.GraphStructure(),
    }
    views["device copies"].set_csr_graph(g.csr_row_ptr.cuda(), g.csr_col_ind.cuda())
    views["device copies"].set_edge_attribute("weight", g.edge_weight.cuda())
    for name, gg in views.items():
        for k in (1, 5, 40):
            cpu = wg.unweighted_sample_without_replacement(g, centers, k, 7, True, True)
            gpu = wg.unweighted_sample_without_replacement(gg, centers.cuda(), k, 7, True, True)
            assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu)), (name, k)
            # weighted: same keys up to the last bit of log(); compare the sets per center
            off, _, eid = wg.weighted_sample_without_replacement(g, centers, k, 7, False, True)
            goff, _, geid = wg.weighted_sample_without_replacement(gg, centers.cuda(), k, 7, False, True)
            assert torch.equal(off, goff.cpu())
            geid = geid.cpu()
            differ = sum(
                set(eid[off[i] : off[i + 1]].tolist()) != set(geid[off[i] : off[i + 1]].tolist())
                for i in range(centers.numel())
            )
            assert differ <= centers.numel() // 1000, (name, k, differ)


def test_append_unique_and_loader_on_gpu(comm: wg.WholeMemoryCommunicator) -> None:
    from wholemem.pyg import sample_subgraph

    g = random_graph(comm)
    gen = torch.Generator().manual_seed(2)
    t, nb = torch.randperm(3000, generator=gen)[:500], torch.randint(0, 3000, (20_000,), generator=gen)
    a, ma = wg.append_unique(t, nb, True)
    b, mb = wg.append_unique(t.cuda(), nb.cuda(), True)
    assert torch.equal(a, b.cpu()) and torch.equal(ma, mb.cpu())
    seeds = torch.randint(0, 2000, (256,), generator=gen)
    cpu = sample_subgraph(g, seeds, [10, 5], 3)
    gpu = sample_subgraph(g.view("cuda"), seeds.cuda(), [10, 5], 3)
    assert torch.equal(cpu.n_id, gpu.n_id.cpu()) and torch.equal(cpu.edge_index, gpu.edge_index.cpu())
