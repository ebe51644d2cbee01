"""Crash consistency: saves SIGKILLed at I/O steps drawn from a seed, on one rank and on two.

Every kill must leave the previous checkpoint or (killed after the commit point, the swap)
the new one, verified bit for bit, and the next save must remove what the killed one left
(distkit_common.testing.crash). The default run draws 6 points of the one-rank case;
``nox -s crash`` sets ``DISTKIT_CRASH_POINTS=100`` and runs every case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distkit_common import fsio
from distkit_common.testing import crash, mpi_env, mpiexec_command
from distx_fake import checkpoint as cp

HERE = Path(__file__).parent
SCRIPT = str(HERE / "scripts" / "crash_ranks.py")
#: kills per case (DISTKIT_CRASH_POINTS=100 in nox -s crash)
POINTS = int(os.environ.get("DISTKIT_CRASH_POINTS", "6"))
#: the cases beyond the first run only in nox -s crash (each is ~50 rank launches)
FULL = pytest.mark.skipif("DISTKIT_CRASH_POINTS" not in os.environ, reason="nox -s crash runs it")


def _record(name: str, tally: crash.Tally) -> None:
    """Print the tally (pytest -s) and add it to $DISTKIT_CRASH_REPORT (nox -s crash)."""
    text = f"### {name}: {tally.total()} kills\n\n{tally.table()}\n"
    print(text)
    out = os.environ.get("DISTKIT_CRASH_REPORT")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(text + "\n")


# each run is bounded by run_series (300 s); the series by 20 s a run, beyond nox's 900 s for 100
@pytest.mark.timeout(120 + 20 * POINTS)
@pytest.mark.parametrize(
    ("ranks", "exchange"), [(1, True), pytest.param(2, True, marks=FULL), pytest.param(1, False, marks=FULL)]
)
def test_killed_saves_leave_the_previous_or_the_new_checkpoint(tmp_path: Path, ranks: int, exchange: bool) -> None:
    """``exchange=False``: the commit of a filesystem without RENAME_EXCHANGE (two renames)."""
    ck = str(tmp_path / "ck")
    cmd = [sys.executable, SCRIPT, ck, *([] if exchange else ["no-exchange"])]
    if ranks > 1:
        cmd = [*mpiexec_command(ranks), *cmd]
    tally = crash.run_series(
        cmd,
        tmp_path / "runs",
        ranks=ranks,
        points=POINTS,
        seed=37 + ranks + 10 * (not exchange),
        rules=crash.commit_phases("metadata.json"),
        env=mpi_env(),
    )
    how = "exchange" if exchange else "two renames (no RENAME_EXCHANGE)"
    _record(f"distx-fake save_state_dict, {ranks} rank(s), commit by {how}", tally)
    assert tally.total() == POINTS
    # the points take the phases in turn: the first (claim, undelayed) is before the commit
    # point, the fifth (removing the replaced folder, undelayed) after it
    if POINTS >= 6:
        assert tally.total("previous") > 0 and tally.total("new") > 0, tally.counts


def test_load_after_a_kill_between_the_two_renames_finds_the_previous_checkpoint(tmp_path: Path) -> None:
    """A save without RENAME_EXCHANGE killed after renaming the checkpoint away, before renaming
    the new one in (what the series found at step 13): the target is missing and the previous
    checkpoint sits under ``<path>.tmp-old-*``, marked by the dead writer. load_state_dict used to
    raise FileNotFoundError (and the next save removed the previous checkpoint); now it loads it."""
    ck = tmp_path / "ck"
    want = {"w": torch.arange(1000, dtype=torch.float64), "step": 7}
    cp.save_state_dict(want, cp.FileSystemWriter(ck), no_dist=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (ck / fsio.REPLACER_MARKER).write_text(json.dumps(dict(fsio.owner_record(), pid=dead.pid)))
    os.rename(ck, fsio.temporary_sibling(ck, fsio.OLD_TOKEN + "0123abcd"))  # what commit_dir does first
    got = {"w": torch.zeros(1000, dtype=torch.float64), "step": 0}
    cp.load_state_dict(got, cp.FileSystemReader(ck), no_dist=True)
    assert torch.equal(got["w"], want["w"]) and got["step"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert sorted(p.name for p in ck.iterdir()) == ["metadata.json", "rank0.bin"]
