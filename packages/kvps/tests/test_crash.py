"""Crash consistency of Server.save: SIGKILLs at I/O steps drawn from a seed, on 1 and 3 ranks.

Every kill (of one rank; mpiexec then ends the job) must leave the previous checkpoint or
(killed after the commit point, the swap) the new one, verified bit for bit on every rank,
and the next save must remove what the killed one left (distkit_common.testing.crash).
The default run draws 6 points of the 3-rank case; ``nox -s crash`` sets
``DISTKIT_CRASH_POINTS=100`` and runs every case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import kvps
from distkit_common import fsio
from distkit_common.testing import crash, mpi_env, mpiexec_command

SCRIPT = str(Path(__file__).parent / "scripts" / "crash_ranks.py")
#: kills per case (DISTKIT_CRASH_POINTS=100 in nox -s crash)
POINTS = int(os.environ.get("DISTKIT_CRASH_POINTS", "6"))
#: the cases beyond the 3-rank one run only in nox -s crash (each is ~50 launches of mpiexec)
FULL = pytest.mark.skipif("DISTKIT_CRASH_POINTS" not in os.environ, reason="nox -s crash runs it")


# each run is bounded by run_series (300 s); the series by 20 s a run, beyond nox's 900 s for 100
@pytest.mark.timeout(120 + 20 * POINTS)
@pytest.mark.parametrize(
    ("fmt", "ranks", "exchange"),
    [
        ("kvps", 3, True),
        pytest.param("kvps", 1, True, marks=FULL),
        pytest.param("distx", 2, True, marks=FULL),
        pytest.param("kvps", 1, False, marks=FULL),
    ],
)
def test_killed_saves_leave_the_previous_or_the_new_checkpoint(
    tmp_path: Path, fmt: str, ranks: int, exchange: bool
) -> None:
    """``exchange=False``: the commit of a filesystem without RENAME_EXCHANGE (two renames)."""
    if fmt == "distx":
        pytest.importorskip("distx_fake")
    tally = crash.run_series(
        [
            *mpiexec_command(ranks),
            sys.executable,
            SCRIPT,
            str(tmp_path / "ck"),
            fmt,
            *([] if exchange else ["no-exchange"]),
        ],
        tmp_path / "runs",
        ranks=ranks,
        points=POINTS,
        seed=37 + ranks + 10 * (not exchange),
        rules=crash.commit_phases("meta.json" if fmt == "kvps" else "metadata.json"),
        env=mpi_env(),
    )
    how = "exchange" if exchange else "two renames (no RENAME_EXCHANGE)"
    text = f"### kvps Server.save(format={fmt!r}), {ranks} rank(s), commit by {how}: {tally.total()} kills\n\n{tally.table()}\n"
    print(text)
    if os.environ.get("DISTKIT_CRASH_REPORT"):
        with open(os.environ["DISTKIT_CRASH_REPORT"], "a", encoding="utf-8") as f:
            f.write(text + "\n")
    assert tally.total() == POINTS
    # the points take the phases in turn: the first (claim, undelayed) is before the commit
    # point, the fifth (removing the replaced folder, undelayed) after it
    if POINTS >= 6:
        assert tally.total("previous") > 0 and tally.total("new") > 0, tally.counts


@pytest.mark.parametrize("fmt", ["kvps", "distx"])
def test_load_after_a_kill_between_the_two_renames_finds_the_previous_checkpoint(tmp_path: Path, fmt: str) -> None:
    """A save without RENAME_EXCHANGE killed after renaming the checkpoint away, before renaming
    the new one in: the target is missing and the previous checkpoint sits under
    ``<path>.tmp-old-*``, marked by the dead writer. server.load used to raise OSError ("cannot
    read") and the next save removed the previous checkpoint; now load finds it."""
    if fmt == "distx":
        pytest.importorskip("distx_fake")
    ck = tmp_path / "ck"
    kvps.setup(5, 1, "none")
    server = kvps.Server(3, dtype=torch.float64)
    w = kvps.Worker(0, server)
    keys = np.arange(5, dtype=np.int64)
    want = torch.arange(15, dtype=torch.float64) + 0.5
    w.set(keys, want)
    server.save(ck, format=fmt)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (ck / fsio.REPLACER_MARKER).write_text(json.dumps(dict(fsio.owner_record(), pid=dead.pid)))
    os.rename(ck, fsio.temporary_sibling(ck, fsio.OLD_TOKEN + "0123abcd"))  # what commit_dir does first
    w.set(keys, torch.zeros(15, dtype=torch.float64))
    server.load(ck, format=fmt)
    got = torch.zeros(15, dtype=torch.float64)
    w.pull(keys, got)
    server.shutdown()
    assert torch.equal(got, want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
