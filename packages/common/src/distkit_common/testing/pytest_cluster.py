"""pytest plugin: the simulated cluster for tests marked ``cluster``.

Load it in a test module (pytest allows ``pytest_plugins`` there, not in a
non-root ``conftest.py``)::

    pytest_plugins = ["distkit_common.testing.pytest_cluster"]

or on the command line: ``pytest -p distkit_common.testing.pytest_cluster`` (the
``cluster`` nox session does). Then every test marked ``@pytest.mark.cluster``
runs with the machine's simulated cluster up - brought up once, at the first
such test, and removed when the session ends (or by the reaper if pytest is
killed) - or is skipped with one message,
``simulated cluster unavailable: <reason>``, where the machine cannot host it
(not root, no ``ip`` or ``unshare``, namespaces forbidden). Such tests launch
jobs with :func:`distkit_common.testing.run_cluster`; the
``simulated_cluster`` fixture gives the :class:`~distkit_common.testing.cluster.Cluster`.

``$DISTKIT_CLUSTER_HOSTS`` sets the number of hosts (default 4),
``$DISTKIT_CLUSTER_RATE`` shapes every host's link (tc's syntax, ``1gbit``;
default unshaped).
``@pytest.mark.cluster(session=False)`` marks a test that manages clusters
itself: it gets no session and runs before the session's tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ..rates import parse_rate
from . import cluster as _cluster
from ._cluster_rank import STATUS_DIR_ENV

HOSTS_ENV = "DISTKIT_CLUSTER_HOSTS"
RATE_ENV = "DISTKIT_CLUSTER_RATE"
DEFAULT_HOSTS = 4
SKIP_PREFIX = "simulated cluster unavailable: "


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``cluster`` marker (pytest hook).

    Parameters
    ----------
    config : pytest.Config
        The session's configuration.
    """
    config.addinivalue_line("markers", "cluster: runs across simulated hosts (network namespaces)")


def _wants_session(item: pytest.Item) -> bool | None:
    """None: not a cluster test; else whether it runs inside the shared session."""
    marker = item.get_closest_marker("cluster")
    if marker is None:
        return None
    return bool(marker.kwargs.get("session", True))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests that bring clusters up and down themselves first (pytest hook).

    They must run before the shared session holds the cluster.

    Parameters
    ----------
    session : pytest.Session
        The test session.
    config : pytest.Config
        The session's configuration.
    items : list of pytest.Item
        The collected tests.
    """
    first = [it for it in items if _wants_session(it) is False]
    if first:
        items[:] = first + [it for it in items if _wants_session(it) is not False]


def skip_reason() -> str | None:
    """Return the skip message for this machine.

    Returns
    -------
    str or None
        ``"simulated cluster unavailable: <why>"``, or None when it can host the cluster.
    """
    reason = _cluster.unavailable_reason()
    return SKIP_PREFIX + reason if reason else None


def _hosts() -> int:
    raw = os.environ.get(HOSTS_ENV, str(DEFAULT_HOSTS))
    try:
        n = int(raw)
    except ValueError:
        raise pytest.UsageError(f"{HOSTS_ENV}={raw!r} is not an integer") from None
    if not 2 <= n <= _cluster.MAX_HOSTS:
        raise pytest.UsageError(f"{HOSTS_ENV}={n} is out of range [2, {_cluster.MAX_HOSTS}]")
    return n


def _rate() -> str | None:
    raw = os.environ.get(RATE_ENV) or None
    if raw is not None:
        try:
            parse_rate(raw)
        except ValueError as exc:
            raise pytest.UsageError(f"{RATE_ENV}: {exc}") from None
    return raw


@pytest.fixture(scope="session")
def simulated_cluster() -> Iterator[_cluster.Cluster]:
    """The simulated cluster, up for the whole test session (skips where the machine cannot host it)."""
    if os.environ.get(STATUS_DIR_ENV):
        # this pytest runs on a rank of a cluster job: the cluster is its caller's
        c = _cluster.current()
        if c is None:
            pytest.skip(SKIP_PREFIX + "inside a cluster job, but no cluster is up")
        assert c is not None  # pytest.skip does not return
        yield c
        return
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with _cluster.session(_hosts(), _rate()) as c:
        yield c


@pytest.fixture(autouse=True)
def _distkit_cluster_for_marked_tests(request: pytest.FixtureRequest) -> None:
    wants = _wants_session(request.node)
    if wants:
        request.getfixturevalue("simulated_cluster")
    elif wants is False:
        reason = skip_reason()
        if reason:
            pytest.skip(reason)
