"""kvps under mpiexec: every behaviour grouped into a few launches per rank count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from distkit_common.testing import run_mpi

import kvps

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("technique", "nprocs", "pushes"),
    [
        ("all", 1, 20000),
        ("all", 2, 100000),
        ("all", 3, 20000),
        ("all", 4, 100000),
        ("replication_only", 3, 20000),
        ("relocation_only", 2, 20000),
        ("relocation_only", 4, 20000),
        ("none", 3, 20000),
    ],
)
def test_core_behaviours(technique: str, nprocs: int, pushes: int) -> None:
    res = run_mpi(str(SCRIPTS / "core.py"), nprocs, args=(technique, str(pushes)), timeout=150)
    assert f"core ok: technique={technique} ranks={nprocs}" in res.stdout


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("dtype", "save_ranks", "load_ranks"),
    [("float32", 3, 2), ("bfloat16", 1, 4), ("float64", 2, 3)],
)
def test_checkpoint_into_other_rank_count(tmp_path: Path, dtype: str, save_ranks: int, load_ranks: int) -> None:
    ck = tmp_path / "ckpt"
    res = run_mpi(str(SCRIPTS / "persist.py"), save_ranks, args=("save", str(ck), dtype), timeout=120)
    assert "persist save ok" in res.stdout
    res = run_mpi(str(SCRIPTS / "persist.py"), load_ranks, args=("load", str(ck), dtype, str(save_ranks)), timeout=120)
    assert "persist load ok" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_setup_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="use_techniques"):
        kvps.setup(10, 1, "sometimes")
    with pytest.raises(ValueError, match="num_keys"):
        kvps.setup(0)
    with pytest.raises(TypeError, match="num_keys"):
        kvps.setup(10.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_threads"):
        kvps.setup(10, 0)


def test_server_rejects_bad_value_lengths() -> None:
    kvps.setup(5, 1, "none")
    with pytest.raises(ValueError, match=">= 1"):
        kvps.Server(0)
    with pytest.raises(ValueError, match="shape"):
        kvps.Server(np.ones(4, dtype=np.int64))
    with pytest.raises(TypeError, match="integer"):
        kvps.Server(np.ones(5, dtype=np.float32))
    with pytest.raises(ValueError, match=r"value_lengths\[2\]"):
        kvps.Server(torch.tensor([1, 2, -1, 3, 4]))
    with pytest.raises(TypeError, match="dtype"):
        kvps.Server(3, dtype=torch.int32)
    with pytest.raises(TypeError):
        kvps.Server(True)
