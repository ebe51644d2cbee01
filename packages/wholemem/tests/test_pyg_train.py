"""The GNN example trains: GraphSAGE on 2 ranks beats a features-only MLP (mpiexec)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from distkit_common.testing import run_mpi

pytest.importorskip("torch_geometric", reason="torch-geometric (wholemem[pyg]) is not installed")

EXAMPLE = Path(__file__).parent.parent / "benchmarks" / "bench_gnn.py"


@pytest.mark.mpi
@pytest.mark.slow
def test_graphsage_example_beats_features_only_mlp() -> None:
    before = {n for n in os.listdir("/dev/shm") if n.startswith("wholemem-")}
    # 20k nodes (the README's run uses 200k): the CI-sized version of the same script
    res = run_mpi(EXAMPLE, 2, args=["--nodes", "20000", "--epochs", "3", "--no-bench", "--check", "0.2"], timeout=300)
    assert "bench_gnn OK 2" in res.stdout
    result = json.loads(next(line[7:] for line in res.stdout.splitlines() if line.startswith("RESULT ")))
    assert result["gnn_test_accuracy"] >= result["mlp_test_accuracy"] + 0.2, result
    assert result["losses"][-1] < result["losses"][0], result
    assert {n for n in os.listdir("/dev/shm") if n.startswith("wholemem-")} <= before
