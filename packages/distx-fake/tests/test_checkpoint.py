"""Checkpoints: round trip, JSON/no pickle, checksums, atomicity under SIGKILL, async, resharding."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from distkit_common import fsio
from distkit_common.testing import run_spawn
from distx_fake import checkpoint as cp

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "scripts"))
import ckpt_workers  # noqa: E402


def _sample() -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {
            "w": torch.randn(300, 70, generator=g),
            "half": torch.randn(33, dtype=torch.float16, generator=g),
            "bf": torch.randn(5, 7, generator=g).to(torch.bfloat16),
            "i8": torch.arange(-5, 5, dtype=torch.int8),
            "b": torch.tensor([True, False, True]),
            "c": torch.randn(4, dtype=torch.complex64, generator=g),
            "scalar": torch.tensor(2.5, dtype=torch.float64),
            "empty": torch.empty(0, 3),
            "strided": torch.arange(40.0).reshape(5, 8).t(),  # non-contiguous source
        },
        "optim": {"state": {0: {"step": 3, "exp_avg": torch.ones(4)}}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
        "epoch": 4,
        "tag": "hello",
        "betas": (0.9, 0.999),
        "none": None,
    }


def _zeros_like(sd: object) -> object:
    if isinstance(sd, dict):
        return {k: _zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [_zeros_like(v) for v in sd]
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd)
    return None


def _assert_equal(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _assert_equal(a[k], b[k])
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_equal(x, y)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert a == b and type(a) is type(b), (a, b)


def test_roundtrip_all_kinds(tmp_path: Path) -> None:
    sd = _sample()
    cp.save_state_dict(sd, cp.FileSystemWriter(tmp_path / "ck", piece_bytes=4096))
    assert sorted(os.listdir(tmp_path)) == ["ck"]  # no temporary directory left behind
    out = _zeros_like(sd)
    out["betas"] = out["epoch"] = out["tag"] = None  # type: ignore[index]
    cp.load_state_dict(out, cp.FileSystemReader(tmp_path / "ck"))  # type: ignore[arg-type]
    _assert_equal(sd, out)
    # loading into a non-contiguous destination and a shard of the tensor
    w = sd["model"]["w"]  # type: ignore[index]
    dst = torch.zeros(70, 300).t()
    part = cp.LocalShard(torch.zeros(100, 70), (300, 70), (150, 0))
    cp.load_state_dict({"model": {"w": dst}}, cp.FileSystemReader(tmp_path / "ck"))
    cp.load_state_dict({"model": {"w": part}}, cp.FileSystemReader(tmp_path / "ck"))
    assert torch.equal(dst, w) and torch.equal(part.tensor, w[150:250])
    # a column shard (a box restricted along dim 1) and a block of a column-sharded checkpoint
    cols = cp.LocalShard(torch.zeros(300, 20), (300, 70), (0, 30))
    cp.load_state_dict({"model": {"w": cols}}, cp.FileSystemReader(tmp_path / "ck"))
    assert torch.equal(cols.tensor, w[:, 30:50])
    left = cp.LocalShard(w[:, :35].clone(), (300, 70), (0, 0))
    right = cp.LocalShard(w[:, 35:].clone(), (300, 70), (0, 35))
    cp.save_state_dict({"left": left, "right": right}, cp.FileSystemWriter(tmp_path / "cols", piece_bytes=4096))
    block = cp.LocalShard(torch.zeros(50, 20), (300, 70), (100, 25))
    cp.load_state_dict({"left": block}, cp.FileSystemReader(tmp_path / "cols"), no_dist=True)
    assert torch.equal(block.tensor[:, :10], w[100:150, 25:35])  # the part held by "left"
    assert torch.equal(block.tensor[:, 10:], torch.zeros(50, 10))


def test_reads_through_the_page_cache_only_when_the_file_is_there(tmp_path: Path) -> None:
    from distx_fake.checkpoint import _engine

    sd = {"w": torch.arange(1 << 20, dtype=torch.float32)}
    cp.save_state_dict(sd, cp.FileSystemWriter(tmp_path / "cold"))  # O_DIRECT: not in the cache
    cp.save_state_dict(sd, cp.FileSystemWriter(tmp_path / "warm", direct=False))  # buffered: cached
    modes = {}
    for name in ("cold", "warm"):
        fd, direct = _engine.open_for_reading(str(tmp_path / name / "rank0.bin"), True)
        os.close(fd)
        modes[name] = direct
        out = {"w": torch.zeros(1 << 20)}
        cp.load_state_dict(out, cp.FileSystemReader(tmp_path / name))
        assert torch.equal(out["w"], sd["w"])
    if modes["cold"]:  # the filesystem takes O_DIRECT (tmpfs does not)
        assert modes == {"cold": True, "warm": False}
    fd, direct = _engine.open_for_reading(str(tmp_path / "warm" / "rank0.bin"), False)  # never direct unless asked
    os.close(fd)
    assert direct is False


def test_progress_bar_only_when_asked_or_on_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sd = {"w": torch.arange(1 << 16, dtype=torch.float32)}
    cp.save_state_dict(sd, cp.FileSystemWriter(tmp_path / "q"))  # stderr is not a terminal: quiet
    assert capsys.readouterr().err == ""
    cp.save_state_dict(sd, cp.FileSystemWriter(tmp_path / "p", progress=True))
    cp.load_state_dict({"w": torch.zeros(1 << 16)}, cp.FileSystemReader(tmp_path / "p", progress=True))
    err = capsys.readouterr().err
    assert "save" in err and "load" in err and "100%" in err  # tqdm, or the built-in text bar


def test_metadata_is_json_and_loading_never_unpickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sd = _sample()
    cp.save_state_dict(sd, cp.FileSystemWriter(tmp_path / "ck"))
    meta = json.loads((tmp_path / "ck" / "metadata.json").read_text())
    assert meta["format"] == "distx-fake-checkpoint" and meta["checksum"] == "crc32c"
    entry = next(e for e in meta["entries"] if e["path"] == ["model", "w"])
    assert entry["dtype"] == "float32" and entry["shape"] == [300, 70]
    data = (tmp_path / "ck" / "rank0.bin").read_bytes()
    assert b"\x80\x04" not in data[:2] and not data.startswith(b"PK")  # neither pickle nor zip

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("pickle used while loading")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, boom)
    monkeypatch.setattr(torch, "load", boom)
    out = _zeros_like(sd)
    cp.load_state_dict(out, cp.FileSystemReader(tmp_path / "ck"))  # type: ignore[arg-type]
    assert torch.equal(out["model"]["w"], sd["model"]["w"])  # type: ignore[index]


def test_corruption_is_detected_and_names_the_tensor(tmp_path: Path) -> None:
    sd = {"a": torch.arange(1000.0), "b": torch.arange(5000, dtype=torch.int64)}
    cp.save_state_dict(sd, cp.FileSystemWriter(tmp_path / "ck"))
    meta = json.loads((tmp_path / "ck" / "metadata.json").read_text())
    b = next(e for e in meta["entries"] if e["path"] == ["b"])
    off = b["chunks"][0]["pieces"][0][0] + 1234
    f = tmp_path / "ck" / "rank0.bin"
    raw = bytearray(f.read_bytes())
    raw[off] ^= 0x01  # a single flipped bit
    f.write_bytes(bytes(raw))
    out = {"a": torch.zeros(1000), "b": torch.zeros(5000, dtype=torch.int64)}
    with pytest.raises(cp.CheckpointCorruptionError, match="checksum mismatch in tensor 'b'"):
        cp.load_state_dict(out, cp.FileSystemReader(tmp_path / "ck"))
    cp.load_state_dict({"a": out["a"]}, cp.FileSystemReader(tmp_path / "ck"))  # the intact tensor still loads
    assert torch.equal(out["a"], sd["a"])
    # truncated data file
    f.write_bytes(bytes(raw[:100]))
    with pytest.raises(ValueError, match="truncated"):
        cp.load_state_dict({"b": out["b"]}, cp.FileSystemReader(tmp_path / "ck"))
    (tmp_path / "ck" / "metadata.json").write_text("{not json")
    with pytest.raises(cp.CheckpointCorruptionError, match="not valid JSON"):
        cp.load_state_dict(out, cp.FileSystemReader(tmp_path / "ck"))


def test_killed_writer_leaves_previous_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    good = {f"t{i}": torch.full((1000,), float(i)) for i in range(3)}
    cp.save_state_dict(good, cp.FileSystemWriter(ck))
    with subprocess.Popen(
        [sys.executable, str(HERE / "scripts" / "kill_writer.py"), str(ck)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        deadline = time.monotonic() + 120
        killed = False
        while time.monotonic() < deadline and proc.poll() is None:
            tmps = [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
            if tmps and (tmps[0] / "rank0.bin").exists() and (tmps[0] / "rank0.bin").stat().st_size > (32 << 20):
                proc.send_signal(signal.SIGKILL)  # mid-save: data partly written, nothing committed
                killed = True
                break
            time.sleep(0.005)
        if proc.poll() is None and not killed:
            proc.kill()
        output = proc.communicate(timeout=30)[0]
    assert killed, f"writer finished before it could be killed: {output}"
    stale = [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert len(stale) == 1 and any(n.name.startswith(fsio.MARKER_PREFIX + "0") for n in stale[0].iterdir())
    out = {k: torch.zeros(1000) for k in good}
    cp.load_state_dict(out, cp.FileSystemReader(ck))
    for k in good:
        assert torch.equal(out[k], good[k])
    # the next save replaces the checkpoint atomically
    cp.save_state_dict({"t0": torch.full((1000,), 9.0)}, cp.FileSystemWriter(ck))
    back = {"t0": torch.zeros(1000)}
    cp.load_state_dict(back, cp.FileSystemReader(ck))
    assert torch.equal(back["t0"], torch.full((1000,), 9.0))
    # ... and removed the dead writer's temporary folder; nothing else is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert sorted(p.name for p in ck.iterdir()) == ["metadata.json", "rank0.bin"]


#: SIGKILLs of test_writer_killed_at_random_moments (DISTX_CRASH_POINTS=N for more or fewer)
CRASH_POINTS = int(os.environ.get("DISTX_CRASH_POINTS", "100"))


def test_writer_killed_at_random_moments_leaves_a_checkpoint_that_loads(tmp_path: Path) -> None:
    """A writer SIGKILLed at CRASH_POINTS random moments of its save: after every kill the
    checkpoint loads and verifies (checksums, closed-form values) as the previous generation or,
    killed after its commit, the new one; every save that completes removes the temporaries of
    the writers killed before it, and nothing else is left beside the checkpoint."""
    import random

    import crash_writer

    ck = tmp_path / "ck"
    rng = random.Random(20261201)
    cmd = [sys.executable, str(HERE / "scripts" / "crash_writer.py")]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as zygote:
        assert zygote.stdin is not None and zygote.stdout is not None
        stdin, stdout = zygote.stdin, zygote.stdout

        def save(gen: int, kill_after: float | None) -> tuple[str, float]:
            stdin.write(f"{ck} {gen}\n")
            stdin.flush()
            pid = int(stdout.readline())
            if kill_after is not None:
                time.sleep(kill_after)
                with contextlib.suppress(ProcessLookupError):  # it may have finished
                    os.kill(pid, signal.SIGKILL)
            status, code, took = stdout.readline().split()
            return f"{status} {code}", float(took)

        def loaded() -> int:
            out = {k: torch.zeros(n, dtype=torch.float64) for k, n in crash_writer.SHAPES.items()}
            cp.load_state_dict(out, cp.FileSystemReader(ck))
            gen = int(out["bias"][0].item())  # element 0 of every tensor is the generation
            expect = crash_writer.state(gen)
            assert all(torch.equal(out[k], expect[k]) for k in out), f"generation {gen} loads other values"
            return gen

        def leftovers() -> list[str]:
            return sorted(p.name for p in tmp_path.iterdir() if p.name != "ck")

        took = []
        for gen in range(3):  # complete saves: how long one takes, from the fork to its exit
            status, t = save(gen, None)
            assert status == "exit 0" and loaded() == gen and leftovers() == []
            took.append(t)
        span = sorted(took)[1]
        prev, outcomes = 2, {"previous": 0, "new": 0, "completed": 0}
        for i in range(CRASH_POINTS):
            gen = prev + 1
            status, _ = save(gen, rng.uniform(0.0, 1.2 * span))
            now = loaded()
            if status == "exit 0":
                assert now == gen
                outcomes["completed"] += 1
                assert leftovers() == [], f"after a completed save, kill {i}"
            else:
                assert status == f"signal {int(signal.SIGKILL)}", status
                assert now in (prev, gen)
                outcomes["new" if now == gen else "previous"] += 1
            prev = now
        status, _ = save(prev + 1, None)
        assert status == "exit 0" and loaded() == prev + 1
        assert leftovers() == []  # the last killed writers' temporaries went with this save
        stdin.close()
        assert zygote.wait(timeout=300) == 0
    print(f"{CRASH_POINTS} kills in saves of {span * 1e3:.0f} ms: {outcomes}")


@pytest.mark.parametrize("point", ["claim", "remove"])
def test_writer_killed_where_its_folder_had_no_marker_is_cleaned_up(tmp_path: Path, point: str) -> None:
    """The windows the random-SIGKILL test found: a writer killed after making its temporary folder
    but before its owner marker was in it (``claim``), or after removing the replaced checkpoint's
    markers but before the folder itself (``remove``), left an empty folder that no marker tied to
    a dead process, so no later save removed it. Now such a folder's name records its writer."""
    import crash_writer

    ck = tmp_path / "ck"
    cp.save_state_dict(crash_writer.state(0), cp.FileSystemWriter(ck))
    proc = subprocess.run(
        [sys.executable, str(HERE / "scripts" / "kill_at.py"), str(ck), "1", point],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr

    def loaded() -> int:
        out = {k: torch.zeros(n, dtype=torch.float64) for k, n in crash_writer.SHAPES.items()}
        cp.load_state_dict(out, cp.FileSystemReader(ck))
        gen = int(out["bias"][0].item())
        assert all(torch.equal(out[k], crash_writer.state(gen)[k]) for k in out)
        return gen

    # killed before its commit the old generation loads, killed after it the new one
    assert loaded() == (0 if point == "claim" else 1)
    (left,) = [p for p in tmp_path.iterdir() if p.name != "ck"]
    assert left.name.startswith("ck.tmp-") and list(left.iterdir()) == []  # the window: no marker
    cp.save_state_dict(crash_writer.state(2), cp.FileSystemWriter(ck))
    assert loaded() == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # the next save removed it
    assert sorted(p.name for p in ck.iterdir()) == ["metadata.json", "rank0.bin"]


def test_stale_tmp_cleanup_only_removes_provably_abandoned(tmp_path: Path) -> None:
    import json
    import socket

    ck = tmp_path / "ck"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = fsio.owner_record()

    def make(name: str, records: list[dict[str, object]]) -> Path:
        d = tmp_path / f"ck.tmp-{name}"
        d.mkdir()
        (d / "rank0.bin").write_bytes(b"x" * 10)
        for r, rec in enumerate(records):
            (d / f"{fsio.MARKER_PREFIX}{r}.json").write_text(json.dumps(rec))
        return d

    gone = make("dead", [{**me, "pid": dead.pid, "start": "1"}])
    reused = make("reused", [{**me, "start": "0"}])  # our pid, but a different process start
    rebooted = make("reboot", [{**me, "boot_id": "another-boot"}])
    live = make("live", [me])  # a save in progress in this very process
    mixed = make("mixed", [{**me, "pid": dead.pid}, me])  # one writer still alive
    remote = make("remote", [{**me, "host": socket.gethostname() + "-other", "pid": dead.pid}])
    unmarked = make("unmarked", [])
    garbage = make("garbage", [])
    (garbage / f"{fsio.MARKER_PREFIX}0.json").write_text("{not json")
    other = tmp_path / "other.tmp-dead"  # another checkpoint's folder
    other.mkdir()
    (other / f"{fsio.MARKER_PREFIX}0.json").write_text(json.dumps({**me, "pid": dead.pid}))
    cp.save_state_dict({"a": torch.ones(3)}, cp.FileSystemWriter(ck))
    assert not gone.exists() and not reused.exists() and not rebooted.exists()
    for d in (live, mixed, remote, unmarked, garbage, other):
        assert d.exists(), d
    back = {"a": torch.zeros(3)}
    cp.load_state_dict(back, cp.FileSystemReader(ck))
    assert torch.equal(back["a"], torch.ones(3))


def test_async_save_returns_future_and_snapshots(tmp_path: Path) -> None:
    sd = {"w": torch.arange(100.0), "step": 1}
    fut = cp.async_save_state_dict(sd, cp.FileSystemWriter(tmp_path / "a"))
    sd["w"].mul_(-1)  # training continues right away
    assert fut.result(timeout=300) is None
    fut2 = cp.async_save_state_dict({"w": sd["w"]}, cp.FileSystemWriter(tmp_path / "b"))
    fut2.result(timeout=300)
    out = {"w": torch.zeros(100), "step": 0}
    cp.load_state_dict(out, cp.FileSystemReader(tmp_path / "a"))
    assert torch.equal(out["w"], torch.arange(100.0)) and out["step"] == 1
    bad = cp.async_save_state_dict({"x": object()}, cp.FileSystemWriter(tmp_path / "c"))
    with pytest.raises(TypeError, match="'x' has type object"):
        bad.result(timeout=300)
    assert not (tmp_path / "c").exists()


def test_async_save_overlaps_staging_reuses_buffers_and_reports_errors(tmp_path: Path) -> None:
    from distx_fake.checkpoint import _async

    w = torch.arange(1 << 16, dtype=torch.float32)
    fut = cp.async_save_state_dict({"w": w, "b": torch.ones(3)}, cp.FileSystemWriter(tmp_path / "a"), overlap=True)
    fut.wait_staged(timeout=300)  # from here training may change the tensors
    w.mul_(-1)
    assert fut.result(timeout=300) is None
    staged = _async._buffers.by_key['["w"]']
    fut2 = cp.async_save_state_dict({"w": w}, cp.FileSystemWriter(tmp_path / "b"), overlap=True)
    fut2.result(timeout=300)
    assert _async._buffers.by_key['["w"]'] is staged  # the host buffer is reused
    assert list(_async._buffers.by_key) == ['["w"]']  # and one no longer saved is released
    for p, sign in (("a", 1.0), ("b", -1.0)):
        out = {"w": torch.zeros(1 << 16)}
        cp.load_state_dict(out, cp.FileSystemReader(tmp_path / p))
        assert torch.equal(out["w"], sign * torch.arange(1 << 16, dtype=torch.float32))
    bad = cp.async_save_state_dict({"x": object()}, cp.FileSystemWriter(tmp_path / "c"), overlap=True)
    with pytest.raises(TypeError, match="'x' has type object"):
        bad.result(timeout=300)
    with pytest.raises(TypeError, match="'x' has type object"):
        bad.wait_staged(timeout=300)
    with pytest.raises(ValueError, match="if_busy must be one of 'wait', 'replace'"):
        cp.async_save_state_dict({}, cp.FileSystemWriter(tmp_path / "d"), if_busy="queue")


def test_async_save_second_call_waits_for_or_replaces_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distx_fake.checkpoint import _saver

    started = threading.Event()
    gate: list[threading.Event] = []  # when set: the write waits for it
    real_write = _saver.write_chunks

    def slow_write(*a: object, **k: object) -> object:
        started.set()
        if gate:
            assert gate[0].wait(300)
        else:
            time.sleep(0.5)  # a long write: the second save arrives meanwhile
        return real_write(*a, **k)

    monkeypatch.setattr(_saver, "write_chunks", slow_write)
    first = cp.async_save_state_dict({"v": torch.full((10,), 1.0)}, cp.FileSystemWriter(tmp_path / "ck"))
    assert started.wait(300)
    second = cp.async_save_state_dict({"v": torch.full((10,), 2.0)}, cp.FileSystemWriter(tmp_path / "ck"))
    assert first.done()  # "wait": the second started after the first finished
    first.result(timeout=300)
    second.result(timeout=300)
    out = {"v": torch.zeros(10)}
    cp.load_state_dict(out, cp.FileSystemReader(tmp_path / "ck"))
    assert torch.equal(out["v"], torch.full((10,), 2.0))
    started.clear()
    # the third save's write lasts until the fourth has stopped it, however slow the machine
    gate.append(threading.Event())
    third = cp.async_save_state_dict({"v": torch.full((10,), 3.0)}, cp.FileSystemWriter(tmp_path / "ck"))
    threading.Thread(target=lambda: third.stop.wait(300) and gate[0].set(), daemon=True).start()
    assert started.wait(300)
    fourth = cp.async_save_state_dict(
        {"v": torch.full((10,), 4.0)}, cp.FileSystemWriter(tmp_path / "ck2"), if_busy="replace"
    )
    with pytest.raises(cp.CheckpointReplacedError, match="replaced by a newer save"):
        third.result(timeout=300)
    fourth.result(timeout=300)
    cp.load_state_dict(out, cp.FileSystemReader(tmp_path / "ck"))
    assert torch.equal(out["v"], torch.full((10,), 2.0))  # the replaced save committed nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "ck2"]


@pytest.mark.spawn
def test_two_rank_save_loads_on_one_and_three_ranks(tmp_path: Path) -> None:
    path = str(tmp_path / "ck")
    # one 3-process job: ranks 0-1 save (and async-save) through their own group, all 3 load
    run_spawn(ckpt_workers.save_on_two_load_on_three_body, 3, args=(path,), timeout=300)
    # one rank, no process group: plain tensors receive the whole global tensors
    g = ckpt_workers.global_tensors()
    for p in (path, path + "-async"):
        sd = {
            "model": {
                "dt": torch.zeros_like(g["dt"]),
                "dt_rep": torch.zeros_like(g["dt_rep"]),
                "ls": torch.zeros_like(g["ls"]),
                "rep": [
                    torch.zeros_like(g["rep_a"]),
                    torch.zeros_like(g["rep_b"]),
                    {"c": torch.zeros_like(g["rep_c"])},
                ],
            },
            "step": 0,
            "name": "",
        }
        cp.load_state_dict(sd, cp.FileSystemReader(p))
        m = sd["model"]
        assert torch.equal(m["dt"], g["dt"]) and torch.equal(m["ls"], g["ls"])  # type: ignore[index]
        assert torch.equal(m["dt_rep"], g["dt_rep"]) and torch.equal(m["rep"][2]["c"], g["rep_c"])  # type: ignore[index]
        assert sd["step"] == 17


def test_bad_input(tmp_path: Path) -> None:
    w = cp.FileSystemWriter(tmp_path / "ck")
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        cp.save_state_dict([torch.ones(1)], w)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FileSystemWriter"):
        cp.save_state_dict({}, str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'m.f' has type builtin_function"):
        cp.save_state_dict({"m": {"f": len}}, w)
    with pytest.raises(TypeError, match="keys must be str or int"):
        cp.save_state_dict({(1, 2): torch.ones(1)}, w)  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="uint16|dtype"):
        cp.save_state_dict({"u": torch.ones(2, dtype=torch.uint16)}, w)
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        cp.async_save_state_dict(3, w)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FileSystemWriter"):
        cp.async_save_state_dict({}, "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FileSystemReader"):
        cp.load_state_dict({}, w)  # type: ignore[arg-type]
    from distx_fake import fake

    with fake.fake_mode():
        f = torch.ones(3)
    with pytest.raises(TypeError, match="'f' is a fake/meta tensor without data"):
        cp.save_state_dict({"f": f}, w)
    with pytest.raises(TypeError, match="'m' is a fake/meta tensor"):
        cp.save_state_dict({"m": torch.empty(2, device="meta")}, w)
    with pytest.raises(ValueError, match="piece_bytes"):
        cp.FileSystemWriter(tmp_path, piece_bytes=1000)
    with pytest.raises(TypeError, match="path must be"):
        cp.FileSystemReader(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceeds global size"):
        cp.LocalShard(torch.ones(3), (4,), (2,))
    with pytest.raises(ValueError, match="must have 1 dims"):
        cp.LocalShard(torch.ones(3), (4, 4), (0,))
    with pytest.raises(TypeError, match="LocalShard.tensor must be a tensor"):
        cp.LocalShard([1, 2], (2,), (0,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="path must be"):
        cp.FileSystemWriter(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="piece_bytes"):
        cp.FileSystemWriter(tmp_path, piece_bytes=-4096)
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        cp.load_state_dict([torch.ones(1)], cp.FileSystemReader(tmp_path))  # type: ignore[arg-type]
    assert not (tmp_path / "ck").exists()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        cp.load_state_dict({}, cp.FileSystemReader(tmp_path / "nothing"))
    cp.save_state_dict({"a": torch.ones(2, 3), "v": 1}, w)
    r = cp.FileSystemReader(tmp_path / "ck")
    with pytest.raises(KeyError, match="'zz' is not in the checkpoint"):
        cp.load_state_dict({"zz": torch.ones(1)}, r)
    with pytest.raises(ValueError, match=r"checkpoint shape \(2, 3\) != state_dict shape \(3, 2\)"):
        cp.load_state_dict({"a": torch.ones(3, 2)}, r)
    with pytest.raises(ValueError, match="dtype float32 != state_dict dtype torch.float64"):
        cp.load_state_dict({"a": torch.ones(2, 3, dtype=torch.float64)}, r)
    with pytest.raises(ValueError, match="is a value in the checkpoint"):
        cp.load_state_dict({"v": torch.ones(1)}, r)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "precious.txt").write_text("x")
    with pytest.raises(OSError, match="not a distx-fake checkpoint"):
        cp.save_state_dict({"a": torch.ones(1)}, cp.FileSystemWriter(tmp_path / "other"))
    assert (tmp_path / "other" / "precious.txt").read_text() == "x"
