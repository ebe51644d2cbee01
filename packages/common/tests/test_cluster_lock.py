"""The machine's simulated-cluster lock: ``hold``, ``lock_env``, ``session``'s ``wait`` and what a
command line makes of the fd it is handed.

Nothing here needs root or namespaces, nor touches the machine's own lock (another suite may hold
it): the tests that take a lock point the module at a private lock file, and the bad-input tests
replace the lock by a trap, since every bad argument must be refused before the lock is touched.
"""

from __future__ import annotations

import fcntl
import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from distkit_common.testing import cluster
from distkit_common.testing.cluster import _session


@pytest.fixture
def private_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(_session, "STATE_DIR", tmp_path)
    return tmp_path / "lock"


@pytest.fixture
def lock_untouchable(monkeypatch: pytest.MonkeyPatch) -> None:
    def trap(wait: float) -> int:
        raise AssertionError(f"the lock was taken (wait={wait!r}) for a call that should have been refused")

    monkeypatch.setattr(_session, "_lock", trap)


@pytest.fixture
def held_elsewhere(private_lock: Path) -> Iterator[None]:
    """The private lock held through another open file: to flock, another process."""
    fd = os.open(private_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        yield
    finally:
        os.close(fd)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _is_locked(path: Path) -> bool:
    """Whether someone holds ``path``'s flock (tried through an open file of our own)."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


BAD_WAITS = [
    ("soon", TypeError, "wait must be a number of seconds, got str"),
    (None, TypeError, "wait must be a number of seconds, got NoneType"),
    (True, TypeError, "wait must be a number of seconds, got bool"),
    (-1, ValueError, r"wait = -1 is out of range \[0, inf\)"),
    (-0.5, ValueError, r"wait = -0.5 is out of range"),
    # NaN: a deadline that is never reached (it used to wait forever on a held lock)
    (math.nan, ValueError, r"wait = nan is out of range"),
    (math.inf, ValueError, r"wait = inf is out of range"),
]


@pytest.mark.usefixtures("lock_untouchable")
@pytest.mark.parametrize(("wait", "error", "match"), BAD_WAITS)
def test_bad_waits_are_refused_before_the_lock_is_touched(wait: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match), cluster.hold(wait):  # type: ignore[arg-type]
        raise AssertionError("entered the block")
    with pytest.raises(error, match=match), cluster.session(2, wait=wait):  # type: ignore[arg-type]
        raise AssertionError("entered the block")
    assert cluster.lock_env() == ({}, ())


@pytest.mark.usefixtures("lock_untouchable")
@pytest.mark.parametrize(
    ("n", "error", "match"),
    [
        ("2", TypeError, "n must be an int, got str"),
        (2.0, TypeError, "n must be an int, got float"),
        (True, TypeError, "n must be an int, got bool"),
        (0, ValueError, r"n = 0 is out of range \[1, 32\]"),
        (-3, ValueError, r"n = -3 is out of range \[1, 32\]"),
        (33, ValueError, r"n = 33 is out of range \[1, 32\]"),
    ],
)
def test_bad_sizes_are_refused_before_the_lock_is_touched(n: object, error: type[Exception], match: str) -> None:
    # (a session used to take the lock first, waiting up to LOCK_WAIT_S for a size up() then refused)
    with pytest.raises(error, match=match), cluster.session(n):  # type: ignore[arg-type]
        raise AssertionError("entered the block")


def test_hold_takes_the_lock_and_lock_env_hands_it_on(private_lock: Path) -> None:
    assert cluster.lock_env() == ({}, ())
    before = _open_fds()
    with cluster.hold(0):
        env, fds = cluster.lock_env()
        assert len(fds) == 1
        (fd,) = fds
        assert env == {cluster.LOCK_FD_ENV: str(fd)}
        assert os.fstat(fd).st_ino == private_lock.stat().st_ino
        assert private_lock.read_text() == f"{os.getpid()}\n"
        assert _is_locked(private_lock)
        with cluster.hold(0):  # nested: a copy of the held lock, not a second wait
            (inner,) = cluster.lock_env()[1]
            assert inner != fd and os.fstat(inner).st_ino == private_lock.stat().st_ino
        assert cluster.lock_env() == (env, fds)
        assert _is_locked(private_lock)
        # a command line run with lock_env's entry and fd (as a child inherits it) takes the held lock
        os.environ[cluster.LOCK_FD_ENV] = env[cluster.LOCK_FD_ENV]
        try:
            cli = _session._cli_lock()
        finally:
            del os.environ[cluster.LOCK_FD_ENV]
        assert os.fstat(cli).st_ino == private_lock.stat().st_ino
        os.close(cli)
    assert cluster.lock_env() == ({}, ())
    assert not _is_locked(private_lock)
    assert _open_fds() == before


@pytest.mark.usefixtures("held_elsewhere")
def test_a_held_lock_is_refused_in_time_not_waited_on_forever(capsys: pytest.CaptureFixture[str]) -> None:
    before = _open_fds()
    for wait in (0, 0.2):
        with pytest.raises(cluster.ClusterError, match="in use by another process"), cluster.hold(wait):
            raise AssertionError("entered the block")
    assert "waiting for the simulated cluster held by another process" in capsys.readouterr().err
    # a session refused there starts no reaper and removes nothing (its cleanup is the machine's)
    with pytest.raises(cluster.ClusterError, match="in use by another process"), cluster.session(2, wait=0):
        raise AssertionError("entered the block")
    assert cluster.lock_env() == ({}, ())
    assert _open_fds() == before  # every refused attempt closed its lock file


@pytest.mark.parametrize("raw", ["", "abc", "-1", "3.0", "99999", "other file"])
def test_a_command_line_does_not_trust_a_bad_lock_fd(
    raw: str, private_lock: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        # an fd that is not the lock file (flock on it would "succeed" and hold nothing)
        monkeypatch.setenv(cluster.LOCK_FD_ENV, str(other) if raw == "other file" else raw)
        holder = os.open(private_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with pytest.raises(cluster.ClusterError, match="in use by another process"):
                _session._cli_lock()
        finally:
            os.close(holder)
        fd = _session._cli_lock()  # free now: the command line takes the lock itself
        try:
            assert os.fstat(fd).st_ino == private_lock.stat().st_ino
            assert _is_locked(private_lock)
        finally:
            os.close(fd)
    finally:
        os.close(other)
