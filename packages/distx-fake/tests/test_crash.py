"""Crash consistency: saves SIGKILLed at I/O steps drawn from a seed, on one rank and on two.

Every kill must leave the previous checkpoint or (killed after the commit point, the swap)
the new one, verified bit for bit, and the next save must remove what the killed one left
(distkit_common.testing.crash). The default run draws a few points per case;
``nox -s crash`` sets ``DISTKIT_CRASH_POINTS=100``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from distkit_common.testing import crash, mpi_env, mpiexec_command

HERE = Path(__file__).parent
SCRIPT = str(HERE / "scripts" / "crash_ranks.py")
#: kills per case (DISTKIT_CRASH_POINTS=100 in nox -s crash)
POINTS = int(os.environ.get("DISTKIT_CRASH_POINTS", "6"))


def _record(name: str, tally: crash.Tally) -> None:
    """Print the tally (pytest -s) and add it to $DISTKIT_CRASH_REPORT (nox -s crash)."""
    text = f"### {name}: {tally.total()} kills\n\n{tally.table()}\n"
    print(text)
    out = os.environ.get("DISTKIT_CRASH_REPORT")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(text + "\n")


@pytest.mark.parametrize(("ranks", "exchange"), [(1, True), (2, True), (1, False)])
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
