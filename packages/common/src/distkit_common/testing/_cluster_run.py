"""Run a script or pytest file across the hosts of the simulated cluster, and the MPI
point-to-point bound between two of them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..rates import parse_rate
from . import _cluster_job as job
from . import cluster as _cluster
from . import mpi_p2p
from ._cluster_job import FAULT_DEADLINE_S, Fault, RankExit
from ._process import (
    DEFAULT_TIMEOUT,
    RunResult,
    _kill_group,
    _private_mpi_backing,
    _tail,
    mpi_env,
    mpiexec_command,
)


@dataclass
class ClusterResult(RunResult):
    """Outcome of :func:`run_cluster`: the launchers' merged output plus every rank's exit.

    Parameters
    ----------
    returncode : int
        The launchers' first non-zero exit code (0 when all exited 0).
    stdout : str
        The launchers' merged output.
    stderr : str
        Their merged standard error.
    ranks : list of RankExit
        Every rank's exit.
    hosts : dict of str to list of int
        Hostname -> ranks that ran there (from the ranks themselves).
    launcher_codes : list of int or None
        Every launcher's exit code (None: killed).
    fault_at : float or None
        Seconds from the launch to the injected fault (None: no fault).
    ended_after_fault : float or None
        Seconds from the fault until no process of the job was left on its hosts.
    notes : list of str
        What the run observed (the fault, late processes).
    """

    ranks: list[RankExit] = field(default_factory=list)
    #: Hostname -> ranks that ran there (from the ranks themselves).
    hosts: dict[str, list[int]] = field(default_factory=dict)
    launcher_codes: list[int | None] = field(default_factory=list)
    #: Seconds from the launch to the injected fault (None: no fault).
    fault_at: float | None = None
    #: Seconds from the fault until no process of the job was left on any of its hosts.
    ended_after_fault: float | None = None
    notes: list[str] = field(default_factory=list)

    def failed_ranks(self) -> list[RankExit]:
        """List the ranks that exited non-zero or left no exit code (killed, never started).

        Returns
        -------
        list of RankExit
            Those ranks, in rank order.
        """
        return [r for r in self.ranks if r.code != 0]


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
    address (:mod:`distkit_common.testing.cluster`). Ranks fill the hosts in order:
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

    If this process holds no :func:`distkit_common.testing.cluster.session` (the
    ``distkit_common.testing.pytest_cluster`` plugin holds one per test session),
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
        ``"1gbit"``; :func:`distkit_common.rates.parse_rate`). None: the
        links as they are (unshaped outside a session).

    Returns
    -------
    ClusterResult
        The launchers' output and every rank's exit.

    Raises
    ------
    AssertionError
        On timeout (with the output tail and every rank's exit), or when
        ``check`` fails.
    RuntimeError
        If the simulated cluster cannot be brought up (``ClusterError``).
    TypeError, ValueError
        On bad hosts, ranks, launcher, fault or rate.

    Examples
    --------
    >>> res = run_cluster(2, 2, "tests/scripts/job.py", 120,           # doctest: +SKIP
    ...                   fault=Fault("kill", "dkh2", after_line="step 3"))
    >>> sorted(res.hosts)
    ['dkh1', 'dkh2']
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
        parse_rate(rate)
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

    Runs :mod:`distkit_common.testing.mpi_p2p` on one rank per host through
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
