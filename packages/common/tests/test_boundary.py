"""The shared boundary: validation checks, failure agreement, atomic directory commits, launch detection."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from distkit_common import collective, fsio, testing, validate
from distkit_common.launch import LaunchInfo, launch_info

SCRIPTS = Path(__file__).parent / "scripts"


# ------------------------------------------------------------------ validate
class _MyTypeError(TypeError):
    pass


class _MyRangeError(IndexError, ValueError):
    pass


def test_checks_raise_the_package_classes() -> None:
    checks = validate.Checks(type_error=_MyTypeError, index_error=_MyRangeError)
    with pytest.raises(_MyTypeError, match="x must have dtype torch.int64 or torch.int32, got torch.float32"):
        checks.tensor(torch.zeros(2), "x", dtype=(torch.int64, torch.int32))
    with pytest.raises(_MyRangeError, match=r"k\[1\] = 5 is out of range \[0, 5\)"):
        checks.index(np.array([0, 5]), "k", upper=5)
    with pytest.raises(_MyTypeError, match="n must be an int, got float 1.5"):
        checks.int(1.5, "n")


def test_check_tensor_shape_and_devices() -> None:
    t = torch.zeros(3, 4)
    assert validate.check_tensor(t, "x", shape=(3, None), device=("cpu", "cuda")) is t
    assert validate.check_tensor(t, "x", device=torch.device("cpu")) is t
    with pytest.raises(ValueError, match=r"x must have shape \(\*, 5\), got \(3, 4\)"):
        validate.check_tensor(t, "x", shape=(None, 5))
    with pytest.raises(ValueError, match=r"x must have shape \(3, 4, \*\), got \(3, 4\)"):
        validate.check_tensor(t, "x", shape=(3, 4, None))
    with pytest.raises(ValueError, match="x must be on device 'cuda' or 'meta', got cpu"):
        validate.check_tensor(t, "x", device=("cuda", "meta"))
    with pytest.raises(ValueError, match="x must be on device 'cuda:1', got cpu"):
        validate.check_tensor(t, "x", device=torch.device("cuda", 1))


def test_index_devices_and_unusual_dtypes() -> None:
    meta = torch.zeros(3, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="idx must be on device 'cpu', got meta"):
        validate.as_index_tensor(meta, "idx")
    with pytest.raises(TypeError, match="idx must be an integer array of dtype int64, got torch.float8_e4m3fn"):
        validate.as_index_tensor(torch.zeros(2, dtype=torch.float8_e4m3fn), "idx")
    big = torch.tensor([0, 2**40], dtype=torch.uint64)
    with pytest.raises(IndexError, match=r"u\[1\] = 1099511627776 is out of range"):
        validate.as_index_tensor(big, "u", dtypes=("uint64",), upper=10)
    strided = torch.arange(10)[::2]
    out = validate.as_index_tensor(strided, "idx", upper=9)
    assert out.is_contiguous() and out.tolist() == [0, 2, 4, 6, 8]
    assert validate.as_index_tensor(torch.empty(0, dtype=torch.int64), "idx", upper=0).numel() == 0


def test_rank_axis_choice() -> None:
    assert validate.check_rank(np.int64(2), "root", 3) == 2
    with pytest.raises(ValueError, match=r"root = 3 is out of range for a communicator of size 3 \(valid: 0..2\)"):
        validate.check_rank(3, "root", 3)
    assert validate.check_axis(-1, "dim", 3) == 2
    with pytest.raises(ValueError, match="dim = 3 is out of range for a tensor with 3 dimension"):
        validate.check_axis(3, "dim", 3)
    assert validate.check_choice("sum", "mode", ("sum", "mean")) == "sum"
    with pytest.raises(ValueError, match="mode must be one of 'sum', 'mean'; got 'max'"):
        validate.check_choice("max", "mode", ("sum", "mean"))
    with pytest.raises(ValueError, match="mode must be one of"):
        validate.check_choice([], "mode", {"sum"})


# ------------------------------------------------------------------ collective
def test_agree_alone() -> None:
    collective.agree(None, "nothing")
    with pytest.raises(ValueError, match="mine") as info, collective.all_ranks(None, "step"):
        raise ValueError("mine")
    assert not isinstance(info.value, collective.CollectiveError)
    assert collective.allgather_json({"a": (1, 2)}) == [{"a": [1, 2]}]
    assert collective.bcast_json("x") == "x"
    with pytest.raises(ValueError, match="root = 1 is out of range for a group of size 1"):
        collective.bcast_json("x", None, root=1)
    with pytest.raises(TypeError, match="not JSON serializable"):
        collective.allgather_json(object())
    with pytest.raises(TypeError, match="comm must be None, an mpi4py communicator"):
        collective.as_group(42)


def test_collective_error_types() -> None:
    failures = {2: collective.RankFailure("FileNotFoundError", "FileNotFoundError", "no such file")}
    err = collective._remote_type("FileNotFoundError")("load", failures)
    assert isinstance(err, FileNotFoundError) and isinstance(err, collective.CollectiveError)
    assert str(err) == "load failed on rank 2: FileNotFoundError: no such file"
    plain = collective._remote_type("NotAnException")("load", failures)
    assert type(plain) is collective.CollectiveError


@pytest.mark.mpi
def test_agree_over_mpi() -> None:
    res = testing.run_mpi(SCRIPTS / "agree.py", 3, timeout=300)
    assert sorted(line for line in res.stdout.splitlines() if line.endswith(" ok")) == [
        f"rank {r} ok" for r in range(3)
    ]


def _agree_gloo(rank: int, size: int, store: str) -> None:
    import torch.distributed as dist

    testing.init_process_group(rank, size, store)
    assert collective.allgather_json(rank * 10) == [0, 10]
    failure = MemoryError("out of memory on rank 0") if rank == 0 else None
    with pytest.raises(MemoryError) as info:
        collective.agree(None, "alloc", failure)
    assert (rank == 0) != isinstance(info.value, collective.CollectiveError)
    if rank == 1:
        assert str(info.value) == "alloc failed on rank 0: MemoryError: out of memory on rank 0"
    dist.destroy_process_group()


@pytest.mark.spawn
def test_agree_over_torch_process_group() -> None:
    testing.run_spawn(_agree_gloo, 2, timeout=300)


# ------------------------------------------------------------------ fsio
def _folder(path: Path, content: str) -> None:
    path.mkdir()
    (path / "data").write_text(content)


def test_commit_dir_new_and_replace(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    tmp = Path(fsio.temporary_sibling(target))
    assert tmp.name.startswith("ckpt.tmp-") and len(tmp.name) == len("ckpt.tmp-") + 16
    _folder(tmp, "one")
    fsio.claim(tmp, 0)
    fsio.commit_dir(tmp, target)
    assert (target / "data").read_text() == "one" and not tmp.exists()
    assert not [n for n in os.listdir(target) if n.startswith(fsio.MARKER_PREFIX)]
    tmp2 = Path(fsio.temporary_sibling(target))
    _folder(tmp2, "two")
    fsio.commit_dir(tmp2, target)
    assert (target / "data").read_text() == "two"
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_commit_dir_refuses_and_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ckpt"
    _folder(target, "user data")
    tmp = Path(fsio.temporary_sibling(target))
    _folder(tmp, "new")
    with pytest.raises(FileExistsError, match="exists and is not replaceable"):
        fsio.commit_dir(tmp, target, replaceable=lambda p: False)
    assert (target / "data").read_text() == "user data" and tmp.exists()
    # a filesystem without RENAME_EXCHANGE: two renames, the old folder removed
    monkeypatch.setattr(fsio._native, "exchange_paths", lambda a, b: False)
    fsio.commit_dir(tmp, target, replaceable=lambda p: True)
    assert (target / "data").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["ckpt"]


class _Killed(BaseException):
    """Stands for a SIGKILL at that point: nothing after it runs."""


@pytest.mark.parametrize("exchange", [True, False])
def test_commit_dir_killed_before_removing_the_old_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    target = tmp_path / "ckpt"
    _folder(target, "old")
    (target / "sub").mkdir()
    tmp = Path(fsio.temporary_sibling(target))
    _folder(tmp, "new")
    fsio.claim(tmp, 0)
    if not exchange:
        monkeypatch.setattr(fsio._native, "exchange_paths", lambda a, b: False)

    def killed(path: object) -> None:
        raise _Killed

    monkeypatch.setattr(fsio, "remove_claimed", killed)
    with pytest.raises(_Killed):
        fsio.commit_dir(tmp, target)
    assert (target / "data").read_text() == "new"
    # the swapped-out previous folder is claimed by the writer that was killed ...
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("ckpt.tmp-")]
    assert (old / "data").read_text() == "old"
    record = json.loads((old / fsio.REPLACER_MARKER).read_text())
    assert record == fsio.owner_record()
    # ... so once that writer is dead, the next save's clean_stale removes it
    monkeypatch.undo()
    (old / fsio.REPLACER_MARKER).write_text(json.dumps(dict(record, pid=_dead_pid())))
    assert fsio.clean_stale(target) == [str(old)]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_commit_dir_killed_between_the_fallbacks_renames_keeps_the_previous_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without RENAME_EXCHANGE a writer killed after moving the previous folder away but before
    moving the new one in left no folder at the target and the previous one under a temporary
    name, which the next save's clean_stale removed as a dead writer's: the previous checkpoint
    was lost. Now recover() (run by clean_stale and by the loaders) moves it back."""
    target = tmp_path / "ckpt"
    _folder(target, "old")
    tmp = Path(fsio.temporary_sibling(target))
    _folder(tmp, "new")
    fsio.claim(tmp, 0)
    monkeypatch.setattr(fsio._native, "exchange_paths", lambda a, b: False)
    real_rename = os.rename

    def killed_second(src: str, dst: str) -> None:
        if os.fspath(src) == str(tmp):
            raise _Killed
        real_rename(src, dst)

    monkeypatch.setattr(fsio.os, "rename", killed_second)
    with pytest.raises(_Killed):
        fsio.commit_dir(tmp, target)
    monkeypatch.undo()
    assert not target.exists()
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("ckpt.tmp-" + fsio.OLD_TOKEN)]
    # while its writer lives (this process), the window is a save in progress: left alone
    assert fsio.recover(target) is None and not target.exists()
    record = json.loads((old / fsio.REPLACER_MARKER).read_text())
    (old / fsio.REPLACER_MARKER).write_text(json.dumps(dict(record, pid=_dead_pid())))
    (tmp / f"{fsio.MARKER_PREFIX}0.json").write_text(json.dumps(dict(record, pid=_dead_pid())))
    # the next save's clean_stale puts the previous folder back and removes the unfinished one
    assert fsio.clean_stale(target) == [str(tmp)]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    assert sorted(os.listdir(target)) == ["data"] and (target / "data").read_text() == "old"
    assert fsio.recover(target) is None  # nothing to do once the target exists


def test_remove_claimed_removes_the_markers_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ckpt.tmp-x"
    _folder(folder, "data")
    (folder / "sub").mkdir()
    (folder / "sub" / "f").write_text("f")
    fsio.claim(folder, 0)
    fsio.claim(folder, 1)
    (folder / "z").write_text("z")
    order: list[str] = []
    real_unlink, real_rmtree = os.unlink, fsio.shutil.rmtree
    monkeypatch.setattr(  # (rmtree's own unlinks, relative to a folder's fd, are not ours)
        fsio.os, "unlink", lambda p, **kw: (kw or order.append(os.path.basename(p)), real_unlink(p, **kw))
    )
    monkeypatch.setattr(fsio.shutil, "rmtree", lambda p: (order.append(os.path.basename(p)), real_rmtree(p)))
    fsio.remove_claimed(folder)
    assert not folder.exists()
    assert sorted(order[:3]) == ["data", "sub", "z"]
    assert sorted(order[3:]) == [f"{fsio.MARKER_PREFIX}0.json", f"{fsio.MARKER_PREFIX}1.json"]
    with pytest.raises(FileNotFoundError):
        fsio.remove_claimed(folder)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_clean_stale_removes_only_provably_dead_writers(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    me = fsio.owner_record()
    dead = dict(me, pid=_dead_pid())
    cases = {
        "dead": [dead],
        "alive": [me],
        "one_alive": [dead, me],
        "other_host": [dict(dead, host=socket.gethostname() + "-elsewhere")],
        "rebooted": [dict(me, boot_id="00000000-old-boot")],
        "reused_pid": [dict(me, start="1")],
        "unmarked": [],
    }
    for name, records in cases.items():
        folder = tmp_path / f"ckpt.tmp-{name}"
        folder.mkdir()
        for rank, rec in enumerate(records):
            (folder / f"{fsio.MARKER_PREFIX}{rank}.json").write_text(json.dumps(rec))
    (tmp_path / "unrelated.tmp-dead").mkdir()
    removed = sorted(Path(p).name for p in fsio.clean_stale(target))
    assert removed == ["ckpt.tmp-dead", "ckpt.tmp-rebooted", "ckpt.tmp-reused_pid"]
    left = sorted(os.listdir(tmp_path))
    assert left == [
        "ckpt.tmp-alive",
        "ckpt.tmp-one_alive",
        "ckpt.tmp-other_host",
        "ckpt.tmp-unmarked",
        "unrelated.tmp-dead",
    ]


def test_claim_creates_the_folder_claimed_or_joins_it(tmp_path: Path) -> None:
    tmp = tmp_path / "sub" / "ckpt.tmp-x"  # the parent is created too
    fsio.claim(tmp, 0)
    assert os.listdir(tmp) == [f"{fsio.MARKER_PREFIX}0.json"]
    assert json.loads((tmp / f"{fsio.MARKER_PREFIX}0.json").read_text()) == fsio.owner_record()
    (tmp / "rank0.bin").write_bytes(b"x")
    fsio.claim(tmp, 1)  # another rank joins the folder rank 0 made
    assert sorted(os.listdir(tmp)) == [f"{fsio.MARKER_PREFIX}0.json", f"{fsio.MARKER_PREFIX}1.json", "rank0.bin"]
    assert os.listdir(tmp_path / "sub") == ["ckpt.tmp-x"]  # no folder of the making is left
    (tmp_path / "ckpt.tmp-file").write_text("not a folder")
    with pytest.raises(NotADirectoryError):
        fsio.claim(tmp_path / "ckpt.tmp-file", 0)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.tmp-file", "sub"]


_CLAIM_KILLED = """
import os, signal, sys
from distkit_common import fsio
fsio.write_file = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
fsio.claim(sys.argv[1], 0)
"""


def test_claim_killed_before_its_marker_leaves_a_folder_that_clean_stale_removes(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, "-c", _CLAIM_KILLED, str(target) + ".tmp-x"], timeout=300)
    assert proc.returncode == -9
    # the writer died with its folder made and no marker in it: the folder's name records it
    (left,) = tmp_path.iterdir()
    assert left.name.startswith("ckpt.tmp-x" + fsio.OWNED_INFIX) and list(left.iterdir()) == []
    # a live writer's folder in that state, another host's and one of this host before a reboot
    alive = Path(fsio._owned_name(str(target) + ".tmp-alive"))
    m = fsio._OWNED.search(alive.name)
    assert m is not None
    other_host = alive.name[: m.start("host")] + "0" * 8 + alive.name[m.end("host") :]
    other_boot = alive.name[: m.start("boot")] + "0" * 8 + alive.name[m.end("boot") :]
    for p in (alive, tmp_path / other_host, tmp_path / other_boot):
        p.mkdir()
    removed = sorted(Path(p).name for p in fsio.clean_stale(target))
    assert removed == sorted([left.name, other_boot])
    assert sorted(os.listdir(tmp_path)) == sorted([alive.name, other_host])


def test_remove_claimed_killed_before_the_folder_went_leaves_it_tied_to_the_remover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "ckpt"
    folder = tmp_path / "ckpt.tmp-x"
    _folder(folder, "data")
    (folder / f"{fsio.MARKER_PREFIX}0.json").write_text(json.dumps(dict(fsio.owner_record(), pid=_dead_pid())))

    def killed(path: object) -> None:
        raise _Killed

    monkeypatch.setattr(fsio.os, "rmdir", killed)
    with pytest.raises(_Killed):
        fsio.remove_claimed(folder)
    monkeypatch.undo()
    (left,) = tmp_path.iterdir()  # empty, but its name records the remover
    assert left.name.startswith("ckpt.tmp-x" + fsio.OWNED_INFIX) and list(left.iterdir()) == []
    assert fsio.clean_stale(target) == []  # ... which still runs (this process)
    m = fsio._OWNED.search(left.name)
    assert m is not None
    dead = left.with_name(left.name[: m.start("pid")] + str(_dead_pid()) + left.name[m.end("pid") :])
    left.rename(dead)  # as if the remover had been another process, since killed
    assert fsio.clean_stale(target) == [str(dead)]
    assert os.listdir(tmp_path) == []


def test_fsync_path_errors(tmp_path: Path) -> None:
    fsio.fsync_path(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsio.fsync_path(tmp_path / "missing")


# ------------------------------------------------------------------ launch
def test_launch_node_and_slurm_counts() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    assert launch_info(env) == LaunchInfo("torchrun", 3, 4, 1, 2, 1)
    assert (
        launch_info(env).node_rank == 1
        and launch_info({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}).node_rank is None
    )
    slurm = {"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "3"}
    assert launch_info(dict(slurm, SLURM_TASKS_PER_NODE="2(x3),1")) == LaunchInfo("slurm", 6, 7, 0, 1, 3)
    assert launch_info(dict(slurm, SLURM_TASKS_PER_NODE="2(x4)")).local_size == 2


def test_discard_claimed_removes_a_failed_save_and_ignores_what_is_gone(tmp_path: Path) -> None:
    tmp = tmp_path / "ck.tmp-x"
    fsio.claim(tmp, 0)
    (tmp / "sub").mkdir()
    (tmp / "sub" / "part.bin").write_bytes(b"1234")
    (tmp / "rank0.bin").write_bytes(b"5678")
    fsio.discard_claimed(tmp)
    assert list(tmp_path.iterdir()) == []
    fsio.discard_claimed(tmp)  # gone already: no error
    with pytest.raises(FileNotFoundError):
        fsio.remove_claimed(tmp)  # (the strict form says so)
    with pytest.raises(TypeError):
        fsio.discard_claimed(3)  # type: ignore[arg-type]  # not a path: no error to ignore
