"""One job across the simulated cluster's hosts: commands, environment, faults, reaping.

The machinery behind :func:`distkit_common.testing.run_cluster` (see there).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from . import cluster
from ._cluster_rank import STATUS_DIR_ENV

LAUNCHERS = ("mpiexec", "torchrun")
#: "kill": SIGKILL every process of the host (a crash: ranks and launcher daemon);
#: "kill_ranks": SIGKILL the job's ranks on the host (the daemon survives and reports them);
#: "link_down": cut the host off the network (its processes keep running)
FAULT_KINDS = ("kill", "kill_ranks", "link_down")
#: a job must have ended on every host this many seconds after a fault (issue #14)
FAULT_DEADLINE_S = 30.0
#: once one launcher process of a torchrun job failed, the others get this long to end
GRACE_S = 30.0
#: without a fault, host processes (daemons) get this long to leave after the launchers ended
SETTLE_S = 10.0
_POLL_S = 0.05


@dataclass(frozen=True)
class Fault:
    """A fault :func:`~distkit_common.testing.run_cluster` injects into the running job.

    Parameters
    ----------
    kind : {"kill", "kill_ranks", "link_down"}
        ``"kill"``: SIGKILL every process on the host (a host crash);
        ``"kill_ranks"``: SIGKILL only the job's ranks on it;
        ``"link_down"``: take the host's link down (``ip link set dkv<i> down``).
    host : str or int
        The host: its name (``"dkh2"``) or 1-based index.
    after_line : str, optional
        Inject once a line of the job's output contains this text (a marker a rank prints).
    after_seconds : float
        Delay: after the marker line when one is given, else after the launch.
    """

    kind: str
    host: str | int
    after_line: str | None = None
    after_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {FAULT_KINDS}, got {self.kind!r}")
        cluster.resolve_host(self.host)
        if isinstance(self.after_seconds, bool) or not isinstance(self.after_seconds, (int, float)):
            raise TypeError(f"after_seconds must be a number, got {type(self.after_seconds).__name__}")
        if not 0 <= self.after_seconds < 3600:
            raise ValueError(f"after_seconds = {self.after_seconds} is out of range [0, 3600)")
        if self.after_line is not None and (not isinstance(self.after_line, str) or not self.after_line):
            raise ValueError("after_line must be a non-empty string or None")


@dataclass
class RankExit:
    """What one rank of a cluster job did.

    Parameters
    ----------
    rank : int
        The rank.
    host : str or None
        Hostname the rank ran on (None: it never started).
    pid : int or None
        Its process id (None: it never started).
    code : int or None
        Its exit code (None: killed, or never started or finished).
    """

    rank: int
    host: str | None  #: Hostname the rank ran on (None: it never started).
    pid: int | None
    code: int | None  #: Its exit code (None: killed, or never started or finished).


@dataclass
class Placement:
    """Which hosts a job runs on and how many ranks each."""

    hosts: list[cluster.Host]
    ranks: list[int]

    @property
    def total(self) -> int:
        return sum(self.ranks)

    def host_of(self, rank: int) -> cluster.Host:
        """The host rank ``rank`` is placed on (ranks fill hosts in order)."""
        left = rank
        for h, n in zip(self.hosts, self.ranks):
            if 0 <= left < n:
                return h
            left -= n
        raise ValueError(f"rank {rank} is outside the job")


def placement(hosts: int | Sequence[str | int], ranks_per_host: int | Sequence[int]) -> Placement:
    """Normalise ``hosts`` (a count or names/indices) and ``ranks_per_host`` (one count or one per host)."""
    if isinstance(hosts, bool):
        raise TypeError("hosts must be an int or a sequence of host names, got bool")
    if isinstance(hosts, int):
        if not 1 <= hosts <= cluster.MAX_HOSTS:
            raise ValueError(f"hosts = {hosts} is out of range [1, {cluster.MAX_HOSTS}]")
        hs = [cluster.host(i) for i in range(1, hosts + 1)]
    elif isinstance(hosts, (str, bytes)) or not isinstance(hosts, Sequence):
        raise TypeError(f"hosts must be an int or a sequence of host names, got {type(hosts).__name__}")
    else:
        hs = [cluster.resolve_host(h) for h in hosts]
        if not hs:
            raise ValueError("hosts is empty")
        if len({h.name for h in hs}) != len(hs):
            raise ValueError(f"hosts has duplicates: {[h.name for h in hs]}")
    if isinstance(ranks_per_host, bool):
        raise TypeError("ranks_per_host must be an int or a sequence of ints, got bool")
    if isinstance(ranks_per_host, int):
        counts = [ranks_per_host] * len(hs)
    elif isinstance(ranks_per_host, Sequence) and not isinstance(ranks_per_host, (str, bytes)):
        counts = list(ranks_per_host)
        if len(counts) != len(hs):
            raise ValueError(f"ranks_per_host has {len(counts)} entries for {len(hs)} hosts")
    else:
        raise TypeError(f"ranks_per_host must be an int or a sequence of ints, got {type(ranks_per_host).__name__}")
    for c in counts:
        if isinstance(c, bool) or not isinstance(c, int):
            raise TypeError(f"ranks_per_host entries must be ints, got {type(c).__name__}")
        if not 1 <= c <= 64:
            raise ValueError(f"ranks_per_host entry {c} is out of range [1, 64]")
    return Placement(hs, counts)


def _free_port() -> int:
    # The hosts' namespaces live for the whole cluster session, and every job's outgoing
    # connections (gloo, the TCPStore clients, Open MPI's daemons) take ports from the kernel's
    # ephemeral range: a port drawn there was found taken (EADDRINUSE in a torchrun job). Ports
    # below that range are only ever bound on purpose, i.e. by these jobs' stores.
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    low = max(low, 12000)
    return 10000 + secrets.randbelow(low - 10000)


def _rank_runner(target: str, args: Sequence[str]) -> list[str]:
    return ["-m", "distkit_common.testing._cluster_rank", target, *args]


def commands(
    launcher: str, where: Placement, target: str, args: Sequence[str], mpiexec: Sequence[str]
) -> tuple[list[list[str]], dict[str, str]]:
    """Launcher command lines (one for mpiexec, one per host for torchrun) and their extra env."""
    first = where.hosts[0].name
    port = str(_free_port())
    if launcher == "mpiexec":
        # `python -m mpi4py` turns an uncaught exception on any rank into MPI_Abort
        mpi4py = ["-m", "mpi4py"] if importlib.util.find_spec("mpi4py") is not None else []
        spec = ",".join(f"{h.name}:{n}" for h, n in zip(where.hosts, where.ranks))
        cmd = [*mpiexec, "--host", spec, sys.executable, *mpi4py, *_rank_runner(target, args)]
        # for scripts that also open a torch.distributed group (init_method="env://")
        return [cmd], {"MASTER_ADDR": first, "MASTER_PORT": port}
    if launcher == "torchrun":
        if importlib.util.find_spec("torch") is None:
            raise RuntimeError("launcher='torchrun' needs torch installed")
        cmds = []
        for node, (h, n) in enumerate(zip(where.hosts, where.ranks)):
            cmds.append(
                [
                    *cluster.exec_prefix(h),
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    f"--nnodes={len(where.hosts)}",
                    f"--node-rank={node}",
                    f"--nproc-per-node={n}",
                    f"--master-addr={first}",
                    f"--master-port={port}",
                    "--max-restarts=0",
                    *_rank_runner(target, args),
                ]
            )
        return cmds, {}
    raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")


class _Output:
    """Reads every launcher's stdout and stderr in threads; notices a marker line."""

    def __init__(self, marker: str | None) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self.marker = marker
        self.marker_at: float | None = None
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def watch(self, stream: IO[str], sink: list[str]) -> None:
        t = threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
        t.start()
        self._threads.append(t)

    def _pump(self, stream: IO[str], sink: list[str]) -> None:
        for line in stream:
            with self._lock:
                sink.append(line)
                if self.marker and self.marker_at is None and self.marker in line:
                    self.marker_at = time.monotonic()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def text(self) -> tuple[str, str]:
        with self._lock:
            return "".join(self.out), "".join(self.err)


@dataclass
class JobOutcome:
    """Raw outcome of :func:`run_job`."""

    launcher_codes: list[int | None]
    stdout: str
    stderr: str
    ranks: list[RankExit]
    timed_out: bool = False
    fault_at: float | None = None  #: seconds from the launch to the fault
    ended_after_fault: float | None = None  #: seconds from the fault until no process of the job was left
    stragglers: dict[str, list[int]] = field(default_factory=dict)  #: processes killed at the end, per host
    notes: list[str] = field(default_factory=list)


def _read_ranks(folder: Path, where: Placement) -> list[RankExit]:
    out = []
    for r in range(where.total):
        host = pid = code = None
        with contextlib.suppress(OSError, ValueError):
            pid_s, host = (folder / f"start-{r}").read_text().split()
            pid = int(pid_s)
        with contextlib.suppress(OSError, ValueError):
            code = int((folder / f"exit-{r}").read_text())
        out.append(RankExit(r, host, pid, code))
    return out


def _host_pids(hosts: Sequence[cluster.Host]) -> dict[str, list[int]]:
    return {h.name: p for h in hosts if (p := cluster.host_pids(h))}


def _inject(fault: Fault, folder: Path) -> str:
    h = cluster.resolve_host(fault.host)
    if fault.kind == "kill":
        pids = cluster.kill_host(h)
        return f"fault: killed every process on {h.name} (pids {pids})"
    if fault.kind == "kill_ranks":
        killed = []
        for f in sorted(folder.glob("start-*")):
            with contextlib.suppress(OSError, ValueError):
                pid, name = f.read_text().split()
                if name == h.name:
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(f.name.split("-")[1]))
        return f"fault: killed ranks {sorted(killed)} on {h.name}"
    cluster.link_down(h)
    return f"fault: link {h.link} of {h.name} down"


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A private folder for the job: rank status files and TMPDIR (PRRTE session dirs,
    pytest's tmp_path), removed afterwards even when hosts were killed mid-write."""
    folder = Path(tempfile.mkdtemp(prefix="distkit-cluster-"))
    try:
        (folder / "status").mkdir()
        (folder / "tmp").mkdir()
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_job(
    cmds: list[list[str]],
    env: Mapping[str, str],
    where: Placement,
    timeout: float,
    *,
    cwd: str | None,
    fault: Fault | None,
    kill_tree: Callable[[int], None],
) -> JobOutcome:
    """Start the launcher commands, inject the fault, wait, reap everything; never raises on failure."""
    with _scratch() as scratch:
        status = scratch / "status"
        full_env = dict(env)
        full_env.update({STATUS_DIR_ENV: str(status), "TMPDIR": str(scratch / "tmp")})
        output = _Output(fault.after_line if fault else None)
        procs: list[subprocess.Popen[str]] = []
        outcome = JobOutcome([], "", "", [])
        link_cut = False
        start = time.monotonic()
        try:
            for cmd in cmds:
                p = subprocess.Popen(
                    cmd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    env=full_env,
                    cwd=cwd,
                    start_new_session=True,
                    text=True,
                    errors="replace",
                )
                procs.append(p)
                assert p.stdout is not None and p.stderr is not None
                output.watch(p.stdout, output.out)
                output.watch(p.stderr, output.err)
            deadline = start + timeout
            first_failure: float | None = None
            fault_at: float | None = None
            while True:
                now = time.monotonic()
                codes = [p.poll() for p in procs]
                if fault is not None and fault_at is None:
                    trigger = output.marker_at if fault.after_line else start
                    if trigger is not None and now >= trigger + fault.after_seconds:
                        outcome.notes.append(_inject(fault, status))
                        link_cut = fault.kind == "link_down"
                        fault_at = now
                if all(c is not None for c in codes):
                    break
                if first_failure is None and any(c not in (None, 0) for c in codes):
                    first_failure = now
                if first_failure is not None and now - first_failure > GRACE_S:
                    outcome.notes.append(f"killed the launchers still running {GRACE_S:.0f}s after one failed")
                    for p in procs:
                        kill_tree(p.pid)
                    first_failure = float("inf")  # once
                    continue
                if now > deadline:
                    outcome.timed_out = True
                    break
                if fault_at is not None and now > fault_at + FAULT_DEADLINE_S:
                    break  # hung past the fault deadline: reaped below, reported as stragglers
                time.sleep(_POLL_S)
            # the launchers are done: the job has ended once no process is left on its hosts
            # (a host cut off the network must notice on its own)
            settle = (fault_at + FAULT_DEADLINE_S) if fault_at is not None else time.monotonic() + SETTLE_S
            while not outcome.timed_out and _host_pids(where.hosts) and time.monotonic() < min(settle, deadline):
                time.sleep(_POLL_S)
            ended = time.monotonic()
            if fault_at is not None:
                outcome.fault_at = fault_at - start
                outcome.ended_after_fault = ended - fault_at
            outcome.stragglers = _host_pids(where.hosts)
            if any(p.poll() is None for p in procs):
                outcome.stragglers["launchers"] = [p.pid for p in procs if p.poll() is None]
        finally:
            # reap the whole job: launcher trees (SIGTERM first: mpiexec cleans up), then
            # everything left on the job's hosts (daemons and ranks of a host that was cut off)
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=5)
                kill_tree(p.pid)
            for h in where.hosts:
                cluster.kill_host(h)
            for p in procs:
                p.wait()
            if link_cut and fault is not None:
                cluster.link_up(fault.host)
            output.join(10)
            for p in procs:
                for stream in (p.stdout, p.stderr):
                    if stream is not None:
                        stream.close()
        outcome.launcher_codes = [p.returncode for p in procs]
        outcome.stdout, outcome.stderr = output.text()
        outcome.ranks = _read_ranks(status, where)
        if outcome.stragglers:
            outcome.notes.append(f"processes still on hosts when the job was reaped: {outcome.stragglers}")
    return outcome


def describe(cmds: list[list[str]]) -> str:
    return "\n".join(shlex.join(c) for c in cmds)
