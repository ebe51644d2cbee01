"""GraphStructure across ranks: collective build, sampling and files (mpiexec)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distkit_common.testing import run_mpi

SCRIPTS = Path(__file__).parent / "scripts"


def shm_names() -> set[str]:
    """wholemem's segments currently in /dev/shm."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("wholemem-")}


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_graph_on_ranks_equals_single_process(nprocs: int, tmp_path: Path) -> None:
    before = shm_names()
    res = run_mpi(SCRIPTS / "worker_graph.py", nprocs, args=[str(tmp_path)], timeout=300)
    assert f"worker_graph OK {nprocs}" in res.stdout
    assert shm_names() <= before, "shared-memory segments left behind"
