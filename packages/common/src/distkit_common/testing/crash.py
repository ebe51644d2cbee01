"""Crash consistency: SIGKILL a writer at chosen steps of its save, then check what it left.

A writer script (one process, or every rank of an ``mpiexec`` job) calls
:func:`armed` around the save under test. The parent (:func:`run_series`) runs the
script once to trace the save's I/O steps, then once per kill point. Each run of the
script does, in order:

1. load the checkpoint left by the run before and verify it bit for bit (the script
   knows every generation's values); :meth:`Writer.report` records which generation
   loaded, so the parent tells the previous checkpoint from the new one;
2. save the next generation without a kill and check that nothing is left beside
   the checkpoint (the temporaries of the writer killed before are gone);
3. save once more, armed: the kill point's rank SIGKILLs itself at its ``step``-th I/O
   step, or ``delay`` seconds after it (inside a native write, a sync, a swap).

The I/O steps are Python's audit events of the calls that change the filesystem
(``open`` for writing, ``os.rename``, ``os.remove``, ``os.rmdir``, ``os.mkdir``,
``shutil.rmtree``) plus ``distkit.crash.<name>`` events of native calls that a script
wraps with :func:`audit_calls` (fsync, the directory exchange, the data writes).
Steps are counted from :func:`armed` on, so a run is killed at the same step of the
same sequence wherever the seed put it; the killed rank writes the steps it saw
before dying, so the phase of every kill is read from what happened, not guessed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._process import _kill_group, _tail

#: the environment variable that carries a run's instructions (JSON) to the writer
ENV = "DISTKIT_CRASH"
#: prefix of the audit events of wrapped native calls (:func:`audit_calls`)
NATIVE_EVENT = "distkit.crash."
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.rename": 0, "os.remove": 0, "os.rmdir": 0, "os.mkdir": 0, "shutil.rmtree": 0, "os.truncate": 0}


@dataclass(frozen=True)
class Event:
    """One I/O step of a save: the audit event's name, the path it acts on, seconds since arming.

    Parameters
    ----------
    name : str
        ``open``, ``os.rename``, ... or ``distkit.crash.<name>``.
    path : str
        The first path argument (``""`` when there is none).
    t : float
        Seconds since :func:`armed` began.
    """

    name: str
    path: str
    t: float


def _step(event: str, args: tuple[Any, ...]) -> tuple[str, str] | None:
    """``(name, path)`` when the audit event is an I/O step of a save, else None."""
    if event == "open":
        path, mode, flags = (*args, None, None, None)[:3]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        return (event, os.fsdecode(path) if isinstance(path, (str, bytes)) else str(path)) if writes else None
    if event in _PATH_EVENTS or event.startswith(NATIVE_EVENT):
        first = args[0] if args else ""
        if isinstance(first, (str, bytes, os.PathLike)):
            return event, os.fsdecode(first)
        return event, str(first) if isinstance(first, int) else ""
    return None


def audited(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn``, raising the audit event ``distkit.crash.<name>`` (an I/O step) before each call.

    Parameters
    ----------
    fn : callable
        The function (``os.fsync``, a native binding).
    name : str
        The event's suffix.

    Returns
    -------
    callable
        The wrapper.
    """

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        sys.audit(NATIVE_EVENT + name, *args)
        return fn(*args, **kwargs)

    return wrapped


def audit_calls(owner: Any, attr: str, names: Sequence[str]) -> None:
    """Make calls of ``owner.<attr>.<name>`` I/O steps: each raises ``distkit.crash.<name>`` first.

    ``owner.<attr>`` (typically a module's ``_native`` extension) is replaced by a proxy
    that forwards every attribute and wraps the named ones; for a writer script only.

    Parameters
    ----------
    owner : module or object
        What holds the reference (``distkit_common.fsio``).
    attr : str
        The attribute to proxy (``"_native"``).
    names : sequence of str
        The functions whose calls become steps.
    """
    target = getattr(owner, attr)

    class _Proxy:
        def __getattr__(self, name: str) -> Any:
            return getattr(target, name)

    proxy = _Proxy()
    for name in names:
        setattr(proxy, name, audited(getattr(target, name), name))
    setattr(owner, attr, proxy)


class Writer:
    """The writer script's side: its instructions from ``$DISTKIT_CRASH``, its report, the armed save.

    Parameters
    ----------
    rank : int
        This process's rank in the job (rank 0 writes the report).

    Raises
    ------
    RuntimeError
        If ``$DISTKIT_CRASH`` is not set (the script runs only under :func:`run_series`).
    """

    def __init__(self, rank: int) -> None:
        spec = os.environ.get(ENV)
        if not spec:
            raise RuntimeError(f"${ENV} is not set: run this script through distkit_common.testing.crash.run_series")
        self.spec: dict[str, Any] = json.loads(spec)
        self.rank = rank

    def report(self, **fields: Any) -> None:
        """Write this rank's report of the run: what loaded, what the clean save left.

        Parameters
        ----------
        **fields
            ``loaded`` (the generation that loaded, or None), ``error`` (why verifying
            failed, or None), ``leftovers`` (names beside the checkpoint after the clean
            save), ``clean`` and ``armed`` (the generations those saves wrote).
        """
        _write_json(f"{self.spec['report']}.{self.rank}", fields)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """Count the I/O steps of the enclosed save; record them (trace run) or die at the kill point.

        Yields
        ------
        None
            While the save runs.
        """
        kill: dict[str, Any] = self.spec.get("kill") or {}
        mine = bool(kill) and int(kill["rank"]) == self.rank
        trace = self.spec.get("trace")
        seen: list[Event] = []
        t0 = time.monotonic()
        on = [True]
        timers: list[threading.Timer] = []
        landed = f"{self.spec['landed']}.{self.rank}"

        # held by die() from the moment it takes the steps seen until the kill: a step of the
        # save that had not begun by then waits in the hook, so the record is the last step begun
        # (without it, a delayed kill could record the steps, then the save start the next one
        # -- the rename of an index, say -- before the SIGKILL, and the kill counted in a phase
        # it had left)
        lock = threading.RLock()
        dying = [False]

        def die(delayed: bool) -> None:
            lock.acquire()  # never released: the process ends here
            dying[0] = True
            events = [e.__dict__ for e in seen]
            _write_json(landed, {"delayed": delayed, "events": events})
            os.kill(os.getpid(), signal.SIGKILL)

        def hook(event: str, args: tuple[Any, ...]) -> None:
            if not on[0]:
                return
            step = _step(event, args)
            if step is None:
                return
            with lock:
                if dying[0]:
                    return  # die()'s own record (the other threads wait for the lock)
                seen.append(Event(step[0], step[1], time.monotonic() - t0))
                if mine and len(seen) == int(kill["step"]) + 1:
                    if float(kill["delay"]) <= 0:
                        die(False)
                    timer = threading.Timer(float(kill["delay"]), die, args=(True,))
                    timer.daemon = True
                    timers.append(timer)
                    timer.start()

        # a delayed kill needs the GIL to fire: switch threads often, so it lands near its time
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-4)
        sys.addaudithook(hook)  # audit hooks cannot be removed: one armed save per process
        try:
            yield
        finally:
            on[0] = False
            sys.setswitchinterval(interval)
            for timer in timers:
                timer.cancel()  # the save ended first: it completed, nothing was killed
            if trace:
                seen.append(Event("end", "", time.monotonic() - t0))
                _write_json(f"{trace}.{self.rank}", [e.__dict__ for e in seen])


def _write_json(path: str, obj: Any) -> None:
    # os.open/os.write: the bytes are out before a SIGKILL that follows (no Python buffer)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, json.dumps(obj).encode())
    finally:
        os.close(fd)


@dataclass(frozen=True)
class KillPoint:
    """Where one run dies: ``rank`` SIGKILLs itself at its ``step``-th I/O step (0-based), ``delay`` s after it.

    Parameters
    ----------
    rank : int
        The rank that dies (the launcher then ends the others).
    step : int
        The I/O step, counted from the start of the armed save.
    delay : float
        Seconds after that step (0: just before it runs).
    """

    rank: int
    step: int
    delay: float


def kill_points(
    traces: Mapping[int, Sequence[Event]], n: int, seed: int, rules: Sequence[PhaseRule]
) -> list[KillPoint]:
    """``n`` kill points over every phase of the save, drawn from ``seed``.

    The steps of all ranks are grouped by phase (:func:`phase_of` with ``rules``);
    point ``k`` falls in the ``k``-th phase in turn (so ``n`` at least the number of
    phases reaches every one) and takes that phase's steps in an order shuffled by the
    seed, every step once before any twice. Passes over a phase alternate between dying
    just before the step and after a delay drawn within the time to the next step (the
    trace's), which lands inside native writes, syncs and the swap; the first pass
    starts undelayed in every other phase.

    Parameters
    ----------
    traces : mapping of int to sequence of Event
        Each rank's steps in the trace run (ending with an ``end`` event).
    n : int
        How many points.
    seed : int
        The seed; equal seeds give equal points.
    rules : sequence of (str, callable)
        The phases (:func:`commit_phases`).

    Returns
    -------
    list of KillPoint
        In the order drawn.

    Raises
    ------
    ValueError
        If there are no steps or ``n < 1``.
    """
    by_phase: dict[str, list[tuple[int, int]]] = {}
    for r, evs in sorted(traces.items()):
        for i, ev in enumerate(evs):
            if ev.name != "end":
                by_phase.setdefault(phase_of(evs[: i + 1], rules), []).append((r, i))
    if not by_phase or n < 1:
        raise ValueError(f"need at least one traced step and one point, got {len(by_phase)} phases and n={n!r}")
    rng = random.Random(seed)
    cycles = [rng.sample(steps, len(steps)) for steps in by_phase.values()]
    points = []
    for k in range(n):
        p, visit = k % len(cycles), k // len(cycles)
        r, i = cycles[p][visit % len(cycles[p])]
        delayed = (visit // len(cycles[p]) + p) % 2 == 1
        gap = max(0.0, traces[r][i + 1].t - traces[r][i].t)
        points.append(KillPoint(r, i, rng.uniform(0.0, gap) if delayed else 0.0))
    return points


PhaseRule = tuple[str, Callable[[Event], bool]]


def phase_of(events: Sequence[Event], rules: Sequence[PhaseRule]) -> str:
    """The phase in which the last of ``events`` ran: phases start at their rule's first match, in order.

    Parameters
    ----------
    events : sequence of Event
        The steps up to the kill.
    rules : sequence of (str, callable)
        The phases in order, each with the test of the step that starts it (the first
        phase starts with the save).

    Returns
    -------
    str
        The phase's name.
    """
    current = 0
    for ev in events:
        for k in range(current + 1, len(rules)):
            if rules[k][1](ev):
                current = k
                break
    return rules[current][0]


#: a name with an owner suffix (fsio's claim of a folder being removed)
_OWNED_NAME = re.compile(r"\.own-\d+-")


def _base(ev: Event) -> str:
    return os.path.basename(ev.path)


def commit_phases(index: str) -> list[PhaseRule]:
    """The phases of a save through ``distkit_common.fsio`` whose index file is named ``index``.

    claim (temporary folder and owner marker), data (the files), index (the file that
    makes a folder a checkpoint), swap (marking the folder replaced, the exchange),
    remove previous (the replaced folder goes), finish (markers dropped, parent synced).

    Parameters
    ----------
    index : str
        The index's file name (``metadata.json``, ``meta.json``).

    Returns
    -------
    list of (str, callable)
        For :func:`phase_of`.
    """
    from .. import fsio

    def in_tmp(ev: Event) -> bool:
        return fsio.TMP_INFIX in os.path.basename(os.path.dirname(ev.path))

    return [
        ("claim", lambda ev: False),
        (
            "data",
            lambda ev: in_tmp(ev) and not _base(ev).startswith(fsio.MARKER_PREFIX) and not _OWNED_NAME.search(ev.path),
        ),
        ("index", lambda ev: _base(ev) == index and in_tmp(ev)),
        ("swap", lambda ev: _base(ev) == fsio.REPLACER_MARKER or ev.name == NATIVE_EVENT + "exchange_paths"),
        ("remove previous", lambda ev: ev.name in ("os.remove", "shutil.rmtree") and in_tmp(ev)),
        ("finish", lambda ev: ev.name == "os.remove" and not in_tmp(ev) and _base(ev).startswith(fsio.MARKER_PREFIX)),
    ]


def replace_phases(index: str, staging: str) -> list[PhaseRule]:
    """The phases of a commit that replaces an index file beside the files it names.

    As a safetensors export into a Hugging Face folder commits (``distx_fake``): claim (the
    staging folder ``<staging>.tmp-*`` inside the output folder and its owner marker), data
    (the new files, in the staging folder), place (the new files renamed beside the live
    ones, under names no index uses), index (written in the staging folder), commit (the
    index renamed over the old one), remove previous (the files no index names any more),
    finish (the staging folder removed, the folder synced).

    Parameters
    ----------
    index : str
        The index's file name (``model.safetensors.index.json``).
    staging : str
        The name of the staging folder before its ``.tmp-<token>`` (``.distx-export``).

    Returns
    -------
    list of (str, callable)
        For :func:`phase_of`.
    """
    from .. import fsio

    def in_stage(ev: Event) -> bool:
        return os.path.basename(os.path.dirname(ev.path)).startswith(staging + fsio.TMP_INFIX)

    return [
        ("claim", lambda ev: False),
        ("data", lambda ev: ev.name == "open" and in_stage(ev) and not _base(ev).startswith(fsio.MARKER_PREFIX)),
        ("place", lambda ev: ev.name == "os.rename" and in_stage(ev) and _base(ev) != index),
        ("index", lambda ev: ev.name == "open" and in_stage(ev) and _base(ev) == index),
        ("commit", lambda ev: ev.name == "os.rename" and in_stage(ev) and _base(ev) == index),
        ("remove previous", lambda ev: ev.name == "os.remove" and not in_stage(ev)),
        (
            "finish",
            lambda ev: (
                ev.name == "os.rename"
                and _base(ev).startswith(staging + fsio.TMP_INFIX)
                and not _OWNED_NAME.search(ev.path)
            ),
        ),
    ]


@dataclass
class Tally:
    """What the kills of a series left: per phase, how many left the previous or the new checkpoint.

    Parameters
    ----------
    phases : list of str
        The phases in the order the table lists them (others follow as first seen).
    counts : dict
        ``{phase: {"previous": n, "new": n, "completed": n}}`` ("completed": the save
        ended before its delayed kill fired; it must leave the new one).
    """

    phases: list[str] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, phase: str, outcome: str) -> None:
        """Count one kill.

        Parameters
        ----------
        phase : str
            Where it landed.
        outcome : str
            ``previous``, ``new`` or ``completed``.
        """
        row = self.counts.setdefault(phase, {"previous": 0, "new": 0, "completed": 0})
        row[outcome] += 1

    def total(self, outcome: str | None = None) -> int:
        """The number of kills (of one outcome).

        Parameters
        ----------
        outcome : str, optional
            ``previous``, ``new`` or ``completed``; all when None.

        Returns
        -------
        int
            The count.
        """
        return sum(v for row in self.counts.values() for k, v in row.items() if outcome in (None, k))

    def table(self) -> str:
        """The tally as a Markdown table, phases in the save's order.

        Returns
        -------
        str
            ``| phase | kills | previous loads | new loads | completed |`` rows and a total.
        """
        rows = [
            "| phase | kills | previous loads | new loads | save completed first |",
            "| --- | --- | --- | --- | --- |",
        ]
        order = [p for p in self.phases if p in self.counts] + [p for p in self.counts if p not in self.phases]
        for phase in order:
            c = self.counts[phase]
            rows.append(f"| {phase} | {sum(c.values())} | {c['previous']} | {c['new']} | {c['completed']} |")
        rows.append(
            f"| all | {self.total()} | {self.total('previous')} | {self.total('new')} | {self.total('completed')} |"
        )
        return "\n".join(rows)


def _run_once(cmd: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
    proc = subprocess.Popen(
        list(cmd), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, _ = proc.communicate()
        raise AssertionError(f"crash run timed out after {timeout} s: {' '.join(cmd)}\n{_tail(out)}") from None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # a rank the launcher left behind
    return proc.returncode, out


def run_series(
    cmd: Sequence[str],
    workdir: str | os.PathLike[str],
    *,
    ranks: int,
    points: int,
    seed: int,
    rules: Sequence[PhaseRule],
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
) -> Tally:
    """Run a writer script under ``points`` kills and check every run's report; return the tally.

    Parameters
    ----------
    cmd : sequence of str
        The job (``[python, script, ...]`` or ``mpiexec -n N python script ...``); the
        script makes a :class:`Writer` and saves its checkpoint under ``workdir``.
    workdir : path
        Where the runs' reports and kill records go (not the checkpoint's folder).
    ranks : int
        The job's ranks.
    points : int
        How many kills.
    seed : int
        Seed of :func:`kill_points`.
    rules : sequence of (str, callable)
        The phases (:func:`commit_phases`).
    env : mapping of str to str, optional
        The job's environment (default: this process's).
    timeout : float
        Seconds one run may take.

    Returns
    -------
    Tally
        Per phase, how many kills left the previous and the new checkpoint.

    Raises
    ------
    AssertionError
        If a run fails, a checkpoint does not load and verify as the previous or the
        new generation (torn), a clean save leaves anything beside the checkpoint, or
        a kill does not happen where it was placed.
    """
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    base_env = dict(os.environ if env is None else env)

    def run(i: int, kill: KillPoint | None, trace: bool) -> tuple[int, str, dict[str, Any]]:
        spec: dict[str, Any] = {"report": str(work / f"report-{i}.json"), "landed": str(work / f"landed-{i}")}
        if trace:
            spec["trace"] = str(work / "trace")
        if kill is not None:
            spec["kill"] = {"rank": kill.rank, "step": kill.step, "delay": kill.delay}
        rc, out = _run_once(cmd, {**base_env, ENV: json.dumps(spec)}, timeout)
        reports = []
        for r in range(ranks):
            try:
                reports.append(json.loads(Path(f"{spec['report']}.{r}").read_text()))
            except (OSError, ValueError) as e:
                raise AssertionError(f"run {i}: rank {r} wrote no report (rc {rc}): {e}\n{_tail(out)}") from None
        for r, rep in enumerate(reports):
            if rep.get("error") is not None:
                raise AssertionError(f"run {i}: rank {r} found the checkpoint torn: {rep['error']}\n{_tail(out)}")
            if rep.get("leftovers"):
                raise AssertionError(f"run {i}: the clean save left {rep['leftovers']} beside the checkpoint")
        return rc, out, reports[0]

    rc, out, report = run(0, None, trace=True)
    if rc != 0:
        raise AssertionError(f"the trace run failed (rc {rc}):\n{_tail(out)}")
    prev_rc, prev_out = rc, out
    traces = {r: [Event(**e) for e in json.loads((work / f"trace.{r}").read_text())] for r in range(ranks)}
    tally = Tally(phases=[name for name, _ in rules])
    todo = kill_points(traces, points, seed, rules)
    for i, point in enumerate([*todo, None], start=1):
        prev_report = report
        rc, out, report = run(i, point, trace=False)
        last = todo[i - 2] if i > 1 else None
        loaded = report.get("loaded")
        if loaded == prev_report["armed"]:
            outcome = "new"
        elif loaded == prev_report["clean"]:
            outcome = "previous"
        else:
            raise AssertionError(
                f"run {i}: generation {loaded!r} loaded after a kill at {last}; expected "
                f"{prev_report['clean']} (previous) or {prev_report['armed']} (new)"
            )
        if i > 1:
            landed = _landed(work, i - 1, ranks)
            if prev_rc == 0:
                if outcome != "new":
                    raise AssertionError(f"run {i - 1} completed its save, yet generation {loaded} loaded")
                assert last is not None
                tally.add(phase_of(traces[last.rank][: last.step + 1], rules), "completed")
            else:
                if landed is None:
                    raise AssertionError(f"run {i - 1} failed (rc {prev_rc}) without its kill:\n{_tail(prev_out)}")
                tally.add(phase_of(landed, rules), outcome)
        if point is None and rc != 0:
            raise AssertionError(f"the last (unkilled) run failed (rc {rc}):\n{_tail(out)}")
        prev_rc, prev_out = rc, out
    return tally


def _landed(work: Path, i: int, ranks: int) -> list[Event] | None:
    """The steps the killed rank of run ``i`` saw, or None if no rank killed itself."""
    for r in range(ranks):
        f = work / f"landed-{i}.{r}"
        if f.exists():
            return [Event(**e) for e in json.loads(f.read_text())["events"]]
    return None


__all__ = [
    "ENV",
    "NATIVE_EVENT",
    "Event",
    "KillPoint",
    "PhaseRule",
    "Tally",
    "Writer",
    "audit_calls",
    "audited",
    "commit_phases",
    "kill_points",
    "phase_of",
    "replace_phases",
    "run_series",
]
