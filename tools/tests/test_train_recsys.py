"""The composed training job: resume is bit-identical, bad configuration gets a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distkit_common.testing import run_mpi

JOB = Path(__file__).resolve().parent.parent / "train_recsys.py"
SMALL = [
    "--users",
    "600",
    "--items",
    "256",
    "--batch",
    "64",
    "--hidden",
    "32",
    "--eval-size",
    "512",
    "--ckpt-every",
    "4",
    "--eval-every",
    "5",
    "--quiet",
]


@pytest.mark.mpi
def test_resumed_run_is_bit_identical(tmp_path: Path) -> None:
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run_mpi(JOB, 4, args=[*SMALL, "--steps", "10", "--out", str(full)], timeout=300)
    run_mpi(JOB, 4, args=[*SMALL, "--steps", "10", "--out", str(resumed), "--stop-after", "3"], timeout=300)
    stopped = json.loads((resumed / "summary.json").read_text())
    assert not stopped["finished"] and stopped["last_step"] == 4
    run_mpi(JOB, 4, args=[*SMALL, "--steps", "10", "--out", str(resumed), "--resume"], timeout=300)
    a = json.loads((full / "summary.json").read_text())
    b = json.loads((resumed / "summary.json").read_text())
    assert a["finished"] and b["finished"] and a["last_step"] == b["last_step"] == 10
    assert a["digest"] == b["digest"]  # every rank's model shard and the whole kvps table, bit for bit
    assert a["loss"] == b["loss"]
    assert len(set(a["digest"])) == 2  # tensor-parallel size 2: two distinct head shards
    assert (full / "loss_curve.png").stat().st_size > 1000


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "3"], "--tp 3 does not divide the 4 ranks"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--items", "255"], "--items 255 is not divisible by --tp 2"),
        (["--resume"], "--resume: no checkpoint"),
    ],
)
def test_bad_configuration_is_refused(tmp_path: Path, args: list[str], message: str) -> None:
    res = run_mpi(JOB, 4, args=[*SMALL, "--out", str(tmp_path), *args], timeout=120, check=False)
    assert res.returncode != 0
    assert message in res.stderr
    assert "Traceback" not in res.stderr
