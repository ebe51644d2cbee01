"""Every example of the documentation's getting-started pages runs, as the page says to run it.

The examples live in docs/examples/ and are shown on the pages through `literalinclude`, so what
the reader sees is what runs here. Each example asserts its own numbers (closed forms, equality
with a single-process reference); this test asserts each exit code and the lines it prints.
The examples the pages take from the packages themselves (packages/kvps/example.py,
packages/mpiad/examples/*.py) are run by those packages' test suites.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from distkit_common.testing import mpi_env, run_mpi

DOCS = Path(__file__).resolve().parents[1]
EXAMPLES = DOCS / "examples"
TIMEOUT = 240.0


def _run_torchrun(script: Path, nprocs: int, timeout: float) -> subprocess.CompletedProcess[str]:
    """`torchrun --standalone --nproc-per-node N script` in its own session, killed whole on timeout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout:.0f} s: {cmd}\n{out[-4000:]}\n{err[-4000:]}") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the session
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{out[-4000:]}\n{err[-4000:]}"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_every_example_is_on_a_page() -> None:
    """No example file is left unshown, and no page includes a file that is not here."""
    shown = set()
    for page in DOCS.rglob("*.md"):
        shown |= set(re.findall(r"```\{literalinclude\} [./]*examples/(\S+\.py)", page.read_text()))
    assert shown == {p.name for p in EXAMPLES.glob("*.py")}


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["common_quickstart.py", "wholemem_quickstart.py", "mpiad_quickstart.py"])
def test_mpi_example_runs_on_two_ranks(name: str) -> None:
    res = run_mpi(EXAMPLES / name, 2, timeout=TIMEOUT, env={"OMP_NUM_THREADS": "1"})
    if name == "common_quickstart.py":
        assert "rank 0: ValueError: disk full" in res.stdout, res.stdout
        assert "rank 1: CollectiveValueError: write shard failed on rank 0" in res.stdout, res.stdout
    elif name == "wholemem_quickstart.py":
        assert "rank 0: rows 0..499 are mine" in res.stdout and "rank 1: rows 500..999 are mine" in res.stdout
    else:
        assert "tensor([7., 7., 7.], dtype=torch.float64)" in res.stdout
        assert "tensor([11., 11., 11.], dtype=torch.float64)" in res.stdout


@pytest.mark.mpi
def test_mpiad_example_runs_on_three_ranks() -> None:
    """The gradient's closed form holds for any number of ranks, not only the page's two."""
    res = run_mpi(EXAMPLES / "mpiad_quickstart.py", 3, timeout=TIMEOUT, env={"OMP_NUM_THREADS": "1"})
    # n = 3: 6 + 6 * (rank + 1)
    for rank, grad in enumerate((12, 18, 24)):
        assert f"{rank} tensor([{grad}., {grad}., {grad}.], dtype=torch.float64)" in res.stdout, res.stdout


@pytest.mark.spawn
def test_shardlayers_example_runs_under_torchrun() -> None:
    res = _run_torchrun(EXAMPLES / "shardlayers_quickstart.py", 2, TIMEOUT)
    assert "'3.weight': (1000, 16)" in res.stdout, res.stdout


def test_distx_fake_example_runs_in_one_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "distx_fake_quickstart.py")],
        capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
        env={**mpi_env(), "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tensor(..., size=(8,), fake=True)" in proc.stdout, proc.stdout
    assert f"checkpoints in {tmp_path}" in proc.stdout, proc.stdout
