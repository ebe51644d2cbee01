"""Peer liveness for torch.distributed jobs: a lost rank or host is named within seconds.

A gloo collective whose peer vanished without closing its sockets (a host cut
off the network, a frozen machine) waits for the process group's timeout -
30 minutes by default - and then says only ``Timed out waiting 1800000ms for
recv operation to complete``, naming no one. Open MPI jobs need none of this:
PRRTE's daemons notice a lost host (see ``ci/cluster/README.md``).

:func:`start` runs a thread in every rank that bumps a counter of its own in
the job's TCPStore (``MASTER_ADDR:MASTER_PORT``, the store torchrun or
``init_process_group(init_method="env://")`` already runs) every ``interval``
seconds and reads everyone's. When a peer's counter has not moved for
``timeout`` seconds, or the store itself stops answering, the rank prints::

    distkit heartbeat: rank 0 on dkh1 lost rank 2 on dkh2, rank 3 on dkh2 (no heartbeat for 10.2 s); ending this process

and ends itself (exit code :data:`LOST_PEER_EXIT_CODE`): a collective blocked
in C++ cannot be interrupted from Python (``ProcessGroup.abort()`` does not
wake a gloo wait), and a job that lost a member cannot go on anyway.

The network may give up first: with data in flight, TCP declares a cut link
dead after ``net.ipv4.tcp_retries2`` retransmissions (about 13 s at 5; see
``ci/cluster/README.md``), and the collective raises gloo's ``Connection timed
out`` naming only an address. When an exception leaves :func:`watch`, the rank
therefore prints what its heartbeat knows at that moment - the same
``lost rank 2 on dkh2`` line, or the store it lost contact with - before the
exception goes on.

Usage, right after ``init_process_group``::

    from distkit_common import heartbeat
    with heartbeat.watch():       # or hb = heartbeat.start(); ...; hb.stop()
        train()

Every rank leaves the block; a normal exit waits (up to ``timeout``) until every
rank has, so no rank outlives the store it needs, and a rank that stopped
watching is never reported lost. Costs two small store requests per rank per
interval.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .launch import launch_info

if TYPE_CHECKING:
    from torch.distributed import Store

#: exit code of a process the heartbeat ended (EX_SOFTWARE would hide among crashes)
LOST_PEER_EXIT_CODE = 75
DEFAULT_INTERVAL_S = 1.0
DEFAULT_TIMEOUT_S = 10.0
#: a peer that never beat is judged only after this long (ranks start the watch at different times)
STARTUP_GRACE_S = 60.0
_PREFIX = "distkit/heartbeat"


def _default_on_lost(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(LOST_PEER_EXIT_CODE)


class Heartbeat:
    """The watching thread of one rank (see the module docstring).

    Parameters
    ----------
    host, port : str, int
        The job's TCPStore.
    rank, world_size : int
        This process's place in the job.
    interval : float
        Seconds between two beats.
    timeout : float
        Seconds without a beat (or without an answer from the store) after
        which a peer (or the store's host) counts as lost.
    on_lost : callable, optional
        Called with the message instead of printing it and ending the process.

    Raises
    ------
    ValueError
        If a number is out of range.
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        *,
        interval: float = DEFAULT_INTERVAL_S,
        timeout: float = DEFAULT_TIMEOUT_S,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        if not 0 < interval < timeout:
            raise ValueError(f"need 0 < interval < timeout, got interval={interval}, timeout={timeout}")
        self.host, self.port, self.rank, self.world_size = host, int(port), rank, world_size
        self.interval, self.timeout = float(interval), float(timeout)
        self.on_lost = on_lost or _default_on_lost
        self.hostname = socket.gethostname()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._checker: threading.Thread | None = None
        self._store: Store | None = None
        self._answered = 0.0  # monotonic time of the store's last answer
        self._lock = threading.Lock()
        self._reported = False
        self._wait_for_peers = True
        # what the beating thread last saw, for silent_peers(): peer -> monotonic time its
        # counter last moved, and peer -> hostname
        self._changed: dict[int, float] = {}
        self._names: dict[int, str] = {}

    # -- lifecycle
    def start(self) -> Heartbeat:
        """Connect to the store and start beating.

        Returns
        -------
        Heartbeat
            ``self``.

        Raises
        ------
        RuntimeError
            If the store cannot be reached within ``timeout`` (torch's ``DistStoreError``).
        """
        import torch.distributed as dist

        store = dist.TCPStore(
            self.host,
            self.port,
            is_master=False,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=self.timeout),
        )
        self._store = store
        store.set(self._key("host", self.rank), self.hostname)
        # every counter exists from here on, so reading them never blocks on a missing key
        for r in range(self.world_size):
            store.add(self._key("beat", r), 0)
            store.add(self._key("done", r), 0)
        store.add(self._key("beat", self.rank), 1)  # a rank that started watching has beaten once
        self._answered = time.monotonic()
        self._thread = threading.Thread(target=self._beat, name="distkit-heartbeat", daemon=True)
        self._thread.start()
        # a store request on a dead link blocks in C++ with no timeout: a second thread
        # notices that the store stopped answering
        self._checker = threading.Thread(target=self._check, name="distkit-heartbeat-check", daemon=True)
        self._checker.start()
        return self

    def stop(self, *, wait_for_peers: bool = True) -> None:
        """Stop watching; peers stop expecting beats from this rank.

        With ``wait_for_peers`` (a normal end), waits up to ``timeout`` seconds
        until every peer stopped too: the rank that hosts the store (rank 0
        under ``init_method="env://"``) then never exits while a peer still
        talks to it, which that peer would take for a lost store. Leave it
        False when ending on an error (peers may be dead).

        Parameters
        ----------
        wait_for_peers : bool
            Whether to wait (up to ``timeout`` seconds) until every peer stopped too.
        """
        self._wait_for_peers = wait_for_peers
        self._stop.set()
        for t in (self._thread, self._checker):
            if t is not None:
                t.join(2 * self.timeout + self.interval)
        self._thread = self._checker = None

    # -- the threads
    def _key(self, kind: str, rank: int) -> str:
        return f"{_PREFIX}/{kind}/{rank}"

    def _lost_peers_text(self, lost: list[tuple[int, str, float]]) -> str:
        who = ", ".join(f"rank {r} on {name}" for r, name, _ in lost)
        silent = max(s for _, _, s in lost)
        return f"distkit heartbeat: rank {self.rank} on {self.hostname} lost {who} (no heartbeat for {silent:.1f} s)"

    def _lost_store_text(self, why: str) -> str:
        return (
            f"distkit heartbeat: rank {self.rank} on {self.hostname} lost contact with the job's store "
            f"on {self.host}:{self.port} ({why})"
        )

    def silent_peers(self, at_least: float) -> list[tuple[int, str, float]]:
        """List the watched peers whose heartbeat has not moved for ``at_least`` seconds.

        Parameters
        ----------
        at_least : float
            Seconds of silence.

        Returns
        -------
        list of tuple of (int, str, float)
            ``(rank, hostname, seconds)`` of every such peer (hostname ``'?'`` where its
            name never arrived).

        Raises
        ------
        ValueError
            If ``at_least`` is negative.
        """
        if not at_least >= 0:
            raise ValueError(f"at_least must be >= 0 seconds, got {at_least!r}")
        now = time.monotonic()
        with self._lock:
            changed, names = dict(self._changed), dict(self._names)
        return [(r, names.get(r, "?"), now - t) for r, t in sorted(changed.items()) if now - t >= at_least]

    def explain(self) -> str | None:
        """Give the heartbeat's account of a failure that has just happened.

        Silence of three beat intervals counts: live peers beat every interval, also
        during a collective, since the beats come from a thread of their own.

        Returns
        -------
        str or None
            The account (which peers went silent, on which hosts, or that the store
            stopped answering), or None when every peer and the store answered
            recently (the failure is not a lost peer).
        """
        quiet = 3 * self.interval
        store_silent = time.monotonic() - self._answered
        if store_silent >= quiet:
            return self._lost_store_text(f"no answer for {store_silent:.1f} s") + " before the error below"
        lost = self.silent_peers(quiet)
        return self._lost_peers_text(lost) + " before the error below" if lost else None

    def _report(self, message: str) -> None:
        with self._lock:
            if self._reported:
                return
            self._reported = True
        self.on_lost(message)

    def _check(self) -> None:
        while not self._stop.wait(self.interval):
            silent = time.monotonic() - self._answered
            if silent > self.timeout:
                self._report(self._lost_store_text(f"no answer for {silent:.1f} s") + "; ending this process")
                return

    def _beat(self) -> None:
        store = self._store
        assert store is not None
        peers = [r for r in range(self.world_size) if r != self.rank]
        beat_keys = [self._key("beat", r) for r in peers]
        done_keys = [self._key("done", r) for r in peers]
        last: dict[int, int] = {}
        changed: dict[int, float] = dict.fromkeys(peers, time.monotonic())
        names: dict[int, str] = {}
        with self._lock:
            self._changed, self._names = dict(changed), names
        while not self._stop.wait(self.interval):
            try:
                store.add(self._key("beat", self.rank), 1)
                values = store.multi_get(beat_keys + done_keys)
            except Exception as exc:  # the store's host closed the connection (it crashed)
                if not self._stop.is_set():
                    why = f"{type(exc).__name__}: {_first_line(exc)}"
                    self._report(self._lost_store_text(why) + "; ending this process")
                return
            now = self._answered = time.monotonic()
            lost = []
            for r, b, d in zip(peers, values[: len(peers)], values[len(peers) :]):
                if int(d):
                    continue
                if last.get(r) != int(b):
                    last[r], changed[r] = int(b), now
                elif now - changed[r] > (self.timeout if int(b) > 0 else max(STARTUP_GRACE_S, self.timeout)):
                    lost.append(r)
            for r in peers:  # each peer's name, once it has set it (for explain())
                if r not in names:
                    with contextlib.suppress(Exception):
                        if store.check([self._key("host", r)]):
                            names[r] = store.get(self._key("host", r)).decode()
            with self._lock:  # done peers are not watched any more
                self._changed = {r: changed[r] for r, d in zip(peers, values[len(peers) :]) if not int(d)}
            if lost and not self._stop.is_set():
                gone = [(r, names.get(r, "?"), now - changed[r]) for r in lost]
                self._report(self._lost_peers_text(gone) + "; ending this process")
                return
        with contextlib.suppress(Exception):  # stopped: tell the peers not to expect more beats
            store.add(self._key("done", self.rank), 1)
            deadline = time.monotonic() + self.timeout
            while self._wait_for_peers and time.monotonic() < deadline:
                if all(int(v) for v in store.multi_get(done_keys)):
                    break
                time.sleep(min(self.interval, 0.1))


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


def start(
    *,
    interval: float | None = None,
    timeout: float | None = None,
    on_lost: Callable[[str], None] | None = None,
) -> Heartbeat:
    """Start this rank's heartbeat against the job's store (``MASTER_ADDR``/``MASTER_PORT``).

    Rank and world size come from the launcher (:func:`distkit_common.launch.launch_info`).
    ``interval`` / ``timeout`` default to ``$DISTKIT_HEARTBEAT_INTERVAL_S`` /
    ``$DISTKIT_HEARTBEAT_TIMEOUT_S``, else 1 s / 10 s.

    Parameters
    ----------
    interval : float, optional
        Seconds between two beats.
    timeout : float, optional
        Seconds of silence after which a peer (or the store) counts as lost.
    on_lost : callable, optional
        Called with the message instead of printing it and ending the process
        (exit code :data:`LOST_PEER_EXIT_CODE`).

    Returns
    -------
    Heartbeat
        The started heartbeat; call its ``stop()`` at the end (or use :func:`watch`).

    Raises
    ------
    RuntimeError
        If ``MASTER_ADDR`` / ``MASTER_PORT`` are not set.
    ValueError
        If a number is out of range or a variable is not a number.
    """
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        raise RuntimeError("heartbeat needs MASTER_ADDR and MASTER_PORT (set by torchrun, or set them for env://)")
    info = launch_info()
    return Heartbeat(
        host,
        int(port),
        info.rank,
        info.world_size,
        interval=_seconds("DISTKIT_HEARTBEAT_INTERVAL_S", interval, DEFAULT_INTERVAL_S),
        timeout=_seconds("DISTKIT_HEARTBEAT_TIMEOUT_S", timeout, DEFAULT_TIMEOUT_S),
        on_lost=on_lost,
    ).start()


@contextlib.contextmanager
def watch(
    *,
    interval: float | None = None,
    timeout: float | None = None,
    on_lost: Callable[[str], None] | None = None,
) -> Iterator[Heartbeat]:
    """Watch this rank's peers for the ``with`` block: :func:`start` on entry, ``stop()`` on exit.

    ``stop()`` waits for the peers only when the block ends without an exception. An
    exception leaving the block is preceded on stderr by :meth:`Heartbeat.explain`
    when it has anything to say.

    Parameters
    ----------
    interval : float, optional
        Seconds between two beats (as for :func:`start`).
    timeout : float, optional
        Seconds of silence after which a peer counts as lost (as for :func:`start`).
    on_lost : callable, optional
        Called with the message instead of printing it and ending the process.

    Yields
    ------
    Heartbeat
        The started heartbeat.

    Raises
    ------
    RuntimeError
        If ``MASTER_ADDR`` / ``MASTER_PORT`` are not set.
    ValueError
        If a number is out of range or a variable is not a number.

    Examples
    --------
    >>> from distkit_common import heartbeat
    >>> with heartbeat.watch():       # doctest: +SKIP
    ...     train()
    """
    hb = start(interval=interval, timeout=timeout, on_lost=on_lost)
    try:
        yield hb
    except BaseException:
        account = hb.explain()  # e.g. TCP gave up on a cut link before the heartbeat timed out
        if account:
            print(account, file=sys.stderr, flush=True)
        hb.stop(wait_for_peers=False)
        raise
    hb.stop()


def _seconds(var: str, given: float | None, default: float) -> float:
    if given is not None:
        return float(given)
    raw = os.environ.get(var)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a number") from None
