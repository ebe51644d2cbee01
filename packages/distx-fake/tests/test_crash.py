"""Crash consistency: saves SIGKILLed at I/O steps drawn from a seed, on one rank and on two.

Every kill must leave the previous checkpoint or (killed after the commit point, the swap)
the new one, verified bit for bit, and the next save must remove what the killed one left
(distkit_common.testing.crash); the same for the safetensors export over an earlier export
(the previous or the new folder, as Hugging Face loaders read it). The default run draws 6
points of the one-rank save and kills one export between two shard renames; ``nox -s crash``
sets ``DISTKIT_CRASH_POINTS=100`` and runs every case (the export series too: a run costs what
a save's does, 1.7 s on a quiet 2-core machine, so 6 kills would be over the ~10 s a default case
may take).
"""

from __future__ import annotations

import json
import os
import signal
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
EXPORT_SCRIPT = str(HERE / "scripts" / "crash_export.py")
sys.path.insert(0, str(HERE / "scripts"))
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


@pytest.mark.timeout(120 + 20 * POINTS)
@FULL
def test_killed_exports_leave_the_previous_or_the_new_safetensors_folder(tmp_path: Path) -> None:
    """export_safetensors over the previous export (three shards), killed at any step: the index
    and the files it names load (safetensors' reader) as the previous or the new export."""
    pytest.importorskip("safetensors")
    tally = crash.run_series(
        [sys.executable, EXPORT_SCRIPT, str(tmp_path / "hf")],
        tmp_path / "runs",
        ranks=1,
        points=POINTS,
        seed=41,
        rules=crash.replace_phases("model.safetensors.index.json", ".distx-export"),
    )
    _record("distx-fake export_safetensors over the previous export, 3 shards", tally)
    assert tally.total() == POINTS
    # the first phase (claim, undelayed) is before the commit point, the sixth (removing the
    # replaced shards, undelayed) after it
    if POINTS >= 6:
        assert tally.total("previous") > 0 and tally.total("new") > 0, tally.counts


def test_export_killed_between_two_shard_renames_leaves_the_previous_export(tmp_path: Path) -> None:
    """An export over an earlier one (three shards) killed after renaming its first shard into
    place: the folder still loads as the earlier export, and the next export removes what the
    killed one left. The code before renamed each new shard over the old one of the same name,
    then the index: this kill left the old index over one new and two old files, which loaded
    without error (safetensors files carry no checksums) as a mix of the two exports, and a
    killed export's temporaries, recording no writer, stayed for good."""
    load_file = pytest.importorskip("safetensors.torch").load_file
    from crash_writer import state

    hf = tmp_path / "hf"
    for g in (0, 1):
        cp.save_state_dict(state(g), cp.FileSystemWriter(tmp_path / f"ck{g}"), no_dist=True)
    cp.export_safetensors(tmp_path / "ck0", hf, max_shard_size="1MB")
    (hf / "config.json").write_text("{}")  # a user's file beside the weights

    def load() -> tuple[dict[str, torch.Tensor], set[str]]:
        """As Hugging Face loaders read the folder: the index, then every file it names."""
        files = set(json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"].values())
        got: dict[str, torch.Tensor] = {}
        for fn in sorted(files):
            got.update(load_file(str(hf / fn)))
        return got, files

    assert len(load()[1]) == 3
    script = str(HERE / "scripts" / "export_kill_at.py")
    r = subprocess.run(
        [sys.executable, script, str(tmp_path / "ck1"), str(hf), "2"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
    got, _ = load()
    for k, v in state(0).items():
        # (before: "'bias' is not the previous export's", the first shard's tensor being generation 1's)
        assert torch.equal(got[k], v), f"{k!r} is not the previous export's"
    assert [n for n in os.listdir(hf) if n.startswith(".distx-export.tmp-")], "the killed export's staging folder"
    cp.export_safetensors(tmp_path / "ck1", hf, max_shard_size="1MB")
    got, files = load()
    for k, v in state(1).items():
        assert torch.equal(got[k], v), k
    assert sorted(os.listdir(hf)) == sorted([*files, "model.safetensors.index.json", "config.json"])
