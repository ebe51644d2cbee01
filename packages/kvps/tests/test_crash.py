"""Crash consistency of Server.save: SIGKILLs at I/O steps drawn from a seed, on 1 and 3 ranks.

Every kill (of one rank; mpiexec then ends the job) must leave the previous checkpoint or
(killed after the commit point, the swap) the new one, verified bit for bit on every rank,
and the next save must remove what the killed one left (distkit_common.testing.crash).
The default run draws a few points per case; ``nox -s crash`` sets ``DISTKIT_CRASH_POINTS=100``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from distkit_common.testing import crash, mpi_env, mpiexec_command

SCRIPT = str(Path(__file__).parent / "scripts" / "crash_ranks.py")
#: kills per case (DISTKIT_CRASH_POINTS=100 in nox -s crash)
POINTS = int(os.environ.get("DISTKIT_CRASH_POINTS", "6"))


@pytest.mark.parametrize(
    ("fmt", "ranks", "exchange"), [("kvps", 1, True), ("kvps", 3, True), ("distx", 2, True), ("kvps", 1, False)]
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
