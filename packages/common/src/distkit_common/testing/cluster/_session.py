"""A test session's hold on the simulated cluster: the machine-wide lock and the reaper that removes it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from ...rates import parse_rate
from ._hosts import CLI, LOCK_FD_ENV, LOCK_WAIT_S, STATE_DIR, Cluster, ClusterError, _check_count
from ._lifecycle import down, up
from ._shaping import _apply_rate

# --------------------------------------------------------------------------- session (lock + reaper)

_active: list[Cluster] = []  # the cluster of the session() this process holds, if any


def active() -> Cluster | None:
    """Return the cluster of the :func:`session` this process holds.

    Returns
    -------
    Cluster or None
        The innermost session's cluster, or None outside any.
    """
    return _active[-1] if _active else None


#: the lock files this process holds through hold(), innermost last
_held: list[int] = []


@contextlib.contextmanager
def hold(wait: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the machine's simulated-cluster lock for the ``with`` block, without a cluster.

    For code that inspects or changes the machine's cluster state directly
    (:func:`up`, :func:`down`, :func:`leftovers`), as the harness's own tests
    do: without the lock it would see, or remove, another process's cluster.
    Sessions in this process inside the block use the held lock; a command
    line (``up``, ``down``) run inside it gets the lock through
    :func:`lock_env`.

    Parameters
    ----------
    wait : float
        Seconds (finite, ``>= 0``; 0: try once) to wait for another process's session to end.

    Yields
    ------
    None

    Raises
    ------
    ClusterError
        If the lock is not free in time.
    TypeError, ValueError
        If ``wait`` is not a finite number of seconds ``>= 0`` (checked before the lock is touched).
    """
    _check_wait(wait)
    fd = _lock(wait)
    _held.append(fd)
    try:
        yield
    finally:
        _held.pop()
        os.close(fd)


def lock_env() -> tuple[dict[str, str], tuple[int, ...]]:
    """The environment entry and the fds to pass to a command line run inside :func:`hold`.

    Returns
    -------
    tuple
        ``({LOCK_FD_ENV: fd}, (fd,))`` while this process holds the lock, else ``({}, ())``.
    """
    if not _held:
        return {}, ()
    return {LOCK_FD_ENV: str(_held[-1])}, (_held[-1],)


def _check_wait(wait: object) -> None:
    """Refuse a ``wait`` under which _lock would misbehave: a NaN deadline is never reached (a hang
    while another process holds the lock), and a str fails only after the lock file is open."""
    if isinstance(wait, bool) or not isinstance(wait, (int, float)):
        raise TypeError(f"wait must be a number of seconds, got {type(wait).__name__}")
    if not 0 <= wait < math.inf:
        raise ValueError(f"wait = {wait} is out of range [0, inf): seconds to wait for the lock")


def _lock(wait: float) -> int:
    if _held:  # (flock belongs to the open file: a copy of the held one holds it too)
        return os.dup(_held[-1])
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(STATE_DIR / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
        if time.monotonic() >= deadline:
            os.close(fd)
            raise ClusterError(f"the simulated cluster is in use by another process (see {STATE_DIR / 'lock'})")
        if not told:
            print(f"waiting for the simulated cluster held by another process ({STATE_DIR / 'lock'})", file=sys.stderr)
            told = True
        time.sleep(0.5)


def _cli_lock() -> int:
    """The lock for a command line (``up``, ``down``, ``measure``): refused while someone else holds it.

    A caller that holds the lock (a test's :func:`session`) can run the command line
    under it: it passes its open lock file as an inherited fd named by
    ``$DISTKIT_CLUSTER_LOCK_FD`` (flock belongs to that open file, so locking it again succeeds).
    """
    raw = os.environ.get(LOCK_FD_ENV, "")
    if raw.isdigit():
        fd = int(raw)
        try:
            st, want = os.fstat(fd), os.stat(STATE_DIR / "lock")
            if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return os.dup(fd)
        except OSError:
            pass
    return _lock(0.0)


@contextlib.contextmanager
def session(n: int, rate: str | None = None, *, wait: float = LOCK_WAIT_S) -> Iterator[Cluster]:
    """Hold the machine's simulated cluster of ``n`` hosts for the ``with`` block, then remove it.

    One session at a time per machine (a lock; another process waits up to
    ``wait`` seconds). A reaper process removes the cluster if this process
    dies without leaving the block (SIGKILL, ``os._exit``), and keeps the lock
    until it has. Nested sessions in one process share the outer cluster
    (which must be large enough); a nested session with another ``rate``
    re-shapes it for its block and restores the outer session's shaping after.

    Parameters
    ----------
    n : int
        Number of hosts.
    rate : str, optional
        Shape every host's link to this rate in both directions (tc's syntax,
        :func:`parse_rate`). None: unshaped, or in a nested session the
        outer session's shaping.
    wait : float
        Seconds (finite, ``>= 0``; 0: try once) to wait for another process's session to end.

    Yields
    ------
    Cluster
        The hosts and the rate.

    Raises
    ------
    ClusterError
        If the cluster cannot be brought up or shaped, or the lock is not free in time.
    TypeError, ValueError
        If ``n`` is outside ``[1, MAX_HOSTS]``, ``rate`` is not a valid rate or
        ``wait`` not a finite number ``>= 0`` (all checked before the lock is touched).
    """
    _check_count(n)
    _check_wait(wait)
    bits = None if rate is None else parse_rate(rate)
    outer = active()
    if outer is not None:
        if len(outer) < n:
            raise ClusterError(f"a session of {len(outer)} hosts is active; {n} were asked for")
        inner = outer if rate is None or bits == outer.rate else Cluster(outer.hosts, bits)
        if inner is not outer:
            _apply_rate(outer.hosts, bits)
        _active.append(inner)
        try:
            yield inner
        finally:
            _active.pop()
            if inner is not outer:
                _apply_rate(outer.hosts, outer.rate)
        return
    fd = _lock(wait)
    reaper: subprocess.Popen[bytes] | None = None
    tell = -1
    try:
        r, tell = os.pipe()
        reaper = subprocess.Popen(
            [sys.executable, "-I", str(CLI.resolve()), "_reap", str(r)],
            pass_fds=(r, fd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        os.close(r)
        c = up(n, rate)
        _active.append(c)
        try:
            yield c
        finally:
            _active.pop()
    finally:
        try:
            down()
        finally:
            if reaper is not None:
                with contextlib.suppress(OSError):
                    os.write(tell, b"q")  # we cleaned up: the reaper leaves without touching anything
                with contextlib.suppress(subprocess.TimeoutExpired):
                    reaper.wait(timeout=10)
            if tell >= 0:
                os.close(tell)
            os.close(fd)  # releases the lock (the reaper's copy is gone with it)


def _reap(fd: int) -> int:
    """Reaper: wait for the session's owner; if it died without saying 'q', remove the cluster."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C at the terminal must not stop the cleanup
    try:
        data = os.read(fd, 1)
    except OSError:
        data = b""
    if data != b"q":
        down()
    return 0
