"""Launch detection, validation helpers, dtype codes and the multi-process test runner."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import distkit_common
from distkit_common import dtypes, node, testing, validate
from distkit_common._distkit_common import version as native_version
from distkit_common.launch import LaunchInfo, launch_info

SCRIPTS = Path(__file__).parent / "scripts"


def test_version_is_consistent() -> None:
    assert distkit_common.__version__ == native_version()
    assert (distkit_common.cmake_dir() / "distkit_common-config.cmake").is_file()
    assert (distkit_common.include_dir() / "distkit" / "rows.hpp").is_file()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, LaunchInfo("none", 0, 1, 0, 1)),
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
            LaunchInfo("openmpi", 3, 4, 1, 2),
        ),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
            LaunchInfo("torchrun", 1, 2, 1, 2),
        ),
        ({"PMI_RANK": "2", "PMI_SIZE": "3"}, LaunchInfo("mpich", 2, 3, 0, 1)),
        (
            {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4(x2)"},
            LaunchInfo("slurm", 5, 8, 1, 4),
        ),
    ],
)
def test_launch_info(env: dict[str, str], expected: LaunchInfo) -> None:
    assert launch_info(env) == expected


def test_launch_info_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="RANK='x' is not an integer"):
        launch_info({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="rank 4 is outside world size 2"):
        launch_info({"RANK": "4", "WORLD_SIZE": "2"})


def test_dtype_codes_match_native_numbering() -> None:
    assert dtypes.code_of(torch.float32) == 2 and dtypes.code_of(np.int64) == 6
    assert dtypes.code_of(torch.bfloat16) == 1 and dtypes.code_of("half") == 0
    for name, code in dtypes.CODES.items():
        assert dtypes.torch_dtype(code) == getattr(torch, name)
        assert torch.empty(0, dtype=getattr(torch, name)).element_size() == dtypes.ITEMSIZE[name]
    with pytest.raises(TypeError, match="unsupported dtype"):
        dtypes.code_of(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="not a dtype"):
        dtypes.code_of(object())
    with pytest.raises(TypeError, match="unknown dtype code 99"):
        dtypes.torch_dtype(99)
    assert dtypes.torch_dtype("half") == torch.float16


def test_check_tensor() -> None:
    t = torch.zeros(3, 4)
    assert validate.check_tensor(t, "x", dtype=torch.float32, device="cpu", ndim=2, contiguous=True) is t
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        validate.check_tensor([1], "x")
    with pytest.raises(TypeError, match="x must have dtype torch.int64, got torch.float32"):
        validate.check_tensor(t, "x", dtype=torch.int64)
    with pytest.raises(ValueError, match="x must have 1 dimension"):
        validate.check_tensor(t, "x", ndim=1)
    with pytest.raises(ValueError, match="x must be contiguous"):
        validate.check_tensor(t.t(), "x", contiguous=True)
    with pytest.raises(ValueError, match="must be on device 'cuda'"):
        validate.check_tensor(t, "x", device="cuda")


def test_as_index_tensor() -> None:
    out = validate.as_index_tensor(np.array([3, 1, 2]), "keys", upper=4)
    assert out.dtype == torch.int64 and out.tolist() == [3, 1, 2]
    small = np.array([0, 3, 65535], dtype=np.uint16)
    assert validate.as_index_tensor(small, "k", upper=65536, dtypes=("uint16",)).tolist() == [0, 3, 65535]
    with pytest.raises(IndexError, match=r"k\[2\] = 65535 is out of range"):
        validate.as_index_tensor(small, "k", upper=100, dtypes=("uint16",))
    with pytest.raises(IndexError, match=r"k\[1\] = 7 is out of range"):
        validate.as_index_tensor(torch.tensor([1, 7], dtype=torch.int32), "k", upper=7, dtypes=("int32",))
    assert validate.as_index_tensor([1, 2], "k", allow_sequence=True).tolist() == [1, 2]
    with pytest.raises(TypeError, match="keys must be an integer array of dtype int64, got torch.float32"):
        validate.as_index_tensor(torch.ones(2), "keys")
    with pytest.raises(IndexError, match=r"keys\[1\] = -5 is negative"):
        validate.as_index_tensor(torch.tensor([1, -5]), "keys")
    with pytest.raises(IndexError, match=r"keys\[2\] = 9 is out of range \[0, 9\)"):
        validate.as_index_tensor(torch.tensor([1, 2, 9]), "keys", upper=9)
    with pytest.raises(ValueError, match="keys must be 1-D"):
        validate.as_index_tensor(torch.zeros(2, 2, dtype=torch.int64), "keys")
    with pytest.raises(TypeError, match="must be a torch.Tensor or numpy.ndarray"):
        validate.as_index_tensor("abc", "keys")


def test_check_int() -> None:
    assert validate.check_int(np.int32(3), "n", lo=0, hi=4) == 3
    with pytest.raises(TypeError, match="n must be an int, got bool"):
        validate.check_int(True, "n")
    with pytest.raises(ValueError, match="n must be < 4, got 4"):
        validate.check_int(4, "n", hi=4)


@pytest.mark.mpi
def test_run_mpi_runs_every_rank() -> None:
    res = testing.run_mpi(SCRIPTS / "ranks.py", 3, timeout=300)
    lines = sorted(line for line in res.stdout.splitlines() if line.startswith("rank"))
    assert lines == ["rank 0 of 3 sum 3", "rank 1 of 3 sum 3", "rank 2 of 3 sum 3"]


@pytest.mark.mpi
def test_run_mpi_fails_on_nonzero_exit() -> None:
    with pytest.raises(AssertionError, match="exit code"):
        testing.run_mpi(SCRIPTS / "ranks.py", 2, args=["--fail-rank", "1"], timeout=300)


@pytest.mark.mpi
def test_failure_report_keeps_the_first_traceback_of_a_long_output() -> None:
    """A long stderr is cut to its end plus its first traceback (the root cause among many ranks)."""
    short = "Traceback (most recent call last):\nValueError: x\n"
    assert testing._process._tail(short) == short
    cause = "[rank2]: Traceback (most recent call last):\n[rank2]: ValueError: the cause\n"
    noise = "".join(f"[rank{r}]: RuntimeError: Connection closed by peer\n" for r in range(1000))
    out = testing._process._tail("launcher says hello\n" + cause + noise, 6000)
    assert len(out) < 6100
    assert out.startswith("... (the first traceback)\n[rank2]: Traceback") and "ValueError: the cause" in out
    assert out.endswith("[rank999]: RuntimeError: Connection closed by peer\n")
    # no traceback, or only within the end: just the end
    assert testing._process._tail(noise, 6000) == "...\n" + noise[-6000:]
    late = noise + cause
    assert testing._process._tail(late, 6000) == "...\n" + late[-6000:]


def test_run_mpi_kills_a_hung_job_and_reaps_it() -> None:
    # the kill must come once both ranks have started and hang (rank 0 sleeps, rank 1 waits in
    # a barrier); a timeout too short for a loaded machine to start them is tried again, longer
    # (the hung rank sleeps an hour, longer than pytest's timeout: it is gone below only if
    # run_mpi killed it, and a run_mpi that did not return is caught by that timeout)
    for timeout in (5, 20, 80, 320):
        with pytest.raises(AssertionError, match=f"timed out after {timeout}s") as err:
            testing.run_mpi(SCRIPTS / "ranks.py", 2, args=["--hang-rank", "0"], timeout=timeout)
        if all(f"rank {r} of 2 sum 1" in str(err.value) for r in range(2)):
            break
    else:
        pytest.fail(f"the ranks had not started when the job was killed after {timeout} s")
    # before the kill, every hung rank wrote where it was (faulthandler on SIGABRT)
    assert "most recent call first" in str(err.value) and "ranks.py" in str(err.value)
    # Open MPI's shared-memory files of the killed job lived in a private folder, now removed
    backing = {line.split()[1] for line in str(err.value).splitlines() if line.startswith("backing /dev/shm/")}
    assert len(backing) == 1
    folder = Path(backing.pop())
    assert folder.name.startswith("distkit-mpi-") and not folder.exists()
    # no rank of that job survives (a rank that got its SIGKILL may need a moment to exit)
    deadline = time.monotonic() + 60
    while (left := _hung_ranks_left()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []


def _hung_ranks_left() -> list[int]:
    left = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"--hang-rank" in cmd:
                left.append(int(pid))
    return left


def _spawn_body(rank: int, size: int, store: str, value: int) -> None:
    import torch.distributed as dist

    testing.init_process_group(rank, size, store)
    t = torch.tensor([float(rank + value)])
    dist.all_reduce(t)
    assert t.item() == sum(range(size)) + size * value
    dist.destroy_process_group()


def _spawn_fail(rank: int, size: int, store: str) -> None:
    if rank == 1:
        sys.exit(3)


def _spawn_hang(rank: int, size: int, store: str) -> None:
    time.sleep(600)


@pytest.mark.spawn
def test_run_spawn() -> None:
    testing.run_spawn(_spawn_body, 2, args=(10,), timeout=300)
    with pytest.raises(AssertionError, match="rank 1 exited with code 3"):
        testing.run_spawn(_spawn_fail, 2, timeout=300)
    with pytest.raises(AssertionError, match="timed out"):
        testing.run_spawn(_spawn_hang, 2, timeout=3)


@pytest.mark.spawn
def test_run_spawn_reports_a_rank_that_fails_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    # a body the parent can call but a child cannot import: the child's start-up fails
    def body(rank: int, size: int, store: str) -> None:
        raise AssertionError("never runs in a child")

    body.__qualname__ = "_only_in_the_parent"
    monkeypatch.setattr(sys.modules[__name__], "_only_in_the_parent", body, raising=False)
    with pytest.raises(AssertionError, match=r"rank \d exited with code 1 before its body began"):
        testing.run_spawn(body, 2, timeout=300)
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="start_timeout must be > 0"):
            testing.run_spawn(_spawn_body, 2, args=(1,), start_timeout=bad)


def _rows_body(rank: int, size: int, store: str, rows_path: str, cfg: dict[str, Any]) -> None:
    import json

    with open(rows_path, "a") as f:  # each rank appends whole lines
        f.write(json.dumps({"rank": rank, "x": cfg["x"] * (rank + 1)}) + "\n")
    if cfg.get("hang_rank") == rank:
        time.sleep(600)


@pytest.mark.spawn
def test_run_spawn_rows_keeps_the_rows_of_a_run_that_failed() -> None:
    rows, error = testing.run_spawn_rows(_rows_body, 2, {"x": 3}, 120)
    assert error is None and sorted((r["rank"], r["x"]) for r in rows) == [(0, 3), (1, 6)]
    # the 5 s begin when both ranks have started (not at the spawn: starting Python and
    # importing torch take longer than that on a loaded machine); each writes its row at once
    rows, error = testing.run_spawn_rows(_rows_body, 2, {"x": 5, "hang_rank": 1}, 5)
    assert error is not None and "timed out" in error
    assert sorted((r["rank"], r["x"]) for r in rows) == [(0, 5), (1, 10)]
    for nprocs, timeout in ((0, 10), (True, 10), (2, 0), (2, -1.0)):
        with pytest.raises(ValueError, match="nprocs must be|timeout must be"):
            testing.run_spawn_rows(_rows_body, nprocs, {"x": 1}, timeout)


def test_mpiexec_command_honours_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPIEXEC", "srun --mpi=pmix")
    assert testing.mpiexec_command(4) == ["srun", "--mpi=pmix", "-n", "4"]
    with pytest.raises(ValueError, match="nprocs must be >= 1"):
        testing.mpiexec_command(0)


def test_node_key_is_hostname_boot_id_and_shm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(node.NODE_ID_ENV, raising=False)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    st = os.stat("/dev/shm")
    assert node.node_key() == f"{socket.gethostname()}/{boot}/{st.st_dev}:{st.st_ino}"
    assert node.node_label() == socket.gethostname()
    monkeypatch.setenv(node.NODE_ID_ENV, "")  # empty: as if unset
    assert node.node_key() == f"{socket.gethostname()}/{boot}/{st.st_dev}:{st.st_ino}"


def test_node_id_switch_replaces_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert node.NODE_ID_ENV == "DISTKIT_NODE_ID"
    monkeypatch.setenv("DISTKIT_NODE_ID", "rack2/a")
    assert (node.node_key(), node.node_label()) == ("override/rack2/a", "node rack2/a")
    monkeypatch.setenv("DISTKIT_NODE_ID", "b")  # read on every call (tests set it per rank)
    assert (node.node_key(), node.node_label()) == ("override/b", "node b")
