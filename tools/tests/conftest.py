"""What the composed job's tests share: the job, a small configuration, the resume check.

``test_train_recsys.py`` runs the job on one host (``run_mpi``), ``test_cluster_train.py``
on 2 simulated hosts x 2 ranks (``run_cluster``); both check the same things through
the ``recsys`` fixture.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

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

Run = Callable[[list[str]], object]


def check_resume_is_bit_identical(run: Run, tmp_path: Path) -> dict:
    """10 steps straight, and 4 steps + a resumed run: the same state on every rank, bit for bit.

    ``run(args)`` runs the job on 4 ranks with these arguments and fails unless every rank
    exits 0. Returns the uninterrupted run's summary.
    """
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run([*SMALL, "--steps", "10", "--out", str(full)])
    run([*SMALL, "--steps", "10", "--out", str(resumed), "--stop-after", "3"])
    stopped = json.loads((resumed / "summary.json").read_text())
    assert not stopped["finished"] and stopped["last_step"] == 4
    run([*SMALL, "--steps", "10", "--out", str(resumed), "--resume"])
    a = json.loads((full / "summary.json").read_text())
    b = json.loads((resumed / "summary.json").read_text())
    assert a["finished"] and b["finished"] and a["last_step"] == b["last_step"] == 10
    assert a["digest"] == b["digest"]  # every rank's model shard and the whole kvps table, bit for bit
    assert a["loss"] == b["loss"]
    # the speed counts plain steps only (here 1-3, 6, 7, 9: the others evaluate or save), after 10 of warm-up
    assert a["steps_timed"] == 0 and a["steps_per_s"] is None and a["cpu_s_per_step"] is None
    assert len(a["digest"]) == 4 and len(set(a["digest"])) == 2  # tensor-parallel size 2: two head shards
    assert (full / "loss_curve.png").stat().st_size > 1000
    return a


class Recsys:
    """The job (``job``), a small configuration (``small``) and the shared checks."""

    job = JOB
    small = SMALL
    check_resume_is_bit_identical = staticmethod(check_resume_is_bit_identical)


@pytest.fixture
def recsys() -> Recsys:
    return Recsys()
