"""A simulated cluster on one Linux machine: N hosts as network namespaces.

Host ``i`` (1-based) is the network namespace ``dkh<i>`` with the address
``10.213.0.<i>/24`` on its interface ``dk0``, a veth whose other end ``dkv<i>``
is a port of the bridge ``dkbr0`` (``10.213.0.254``) in the root namespace.
Every command run on a host also gets a UTS namespace of its own whose
hostname is the host's name, so ``socket.gethostname()`` differs per host, as
on a real cluster. Every host resolves every other host (``/etc/netns/<host>/
hosts``, which ``ip netns exec`` mounts over ``/etc/hosts``), and so does the
root namespace (a marked block in ``/etc/hosts``, removed by :func:`down`).

With a rate (:func:`up`, :func:`session`, :func:`shape`) a tbf qdisc on both ends
of each host's veth limits what the host sends (``dk0``) and receives (``dkv<i>``);
``tc`` (iproute2) is then needed too. The rate is read back from the kernel
(:func:`current`, :func:`link_rates`); :func:`measure_tcp` measures a link.

Nothing leaves the machine: the namespaces have no default route, the bridge
has no uplink, and :func:`up` refuses to start when the subnet is already used
by an interface it did not make.

Needs root, ``ip`` (iproute2) and ``unshare`` (util-linux). Only the standard
library is used, so the command line also runs as a file from a source checkout
(``ci/cluster/up`` runs ``__main__.py``)::

    python3 -m distkit_common.testing.cluster up 3              # hosts dkh1..dkh3 (idempotent)
    python3 -m distkit_common.testing.cluster up 3 --rate 1gbit # every link shaped to 1 Gbit/s each way
    python3 -m distkit_common.testing.cluster exec dkh2 hostname
    python3 -m distkit_common.testing.cluster measure dkh1 dkh2 # one TCP stream's goodput
    python3 -m distkit_common.testing.cluster status
    python3 -m distkit_common.testing.cluster down              # removes everything up made (idempotent)

Tests use :func:`session` (through the ``distkit_common.testing.pytest_cluster``
plugin) which serialises users of the machine with a lock and removes the
cluster even when the test process is killed (a reaper process watches it).

The modules, one concern each: ``_hosts`` (names, addresses, processes, faults),
``_shaping`` (tbf on the links), ``_lifecycle`` (up, down, what is up, a job's
settings), ``_session`` (the machine-wide lock and the reaper), ``_measure``
(TCP goodput) and ``__main__`` (the command line).
"""

from __future__ import annotations

from ._hosts import (
    AGENT,
    BRIDGE,
    BRIDGE_ADDRESS,
    CLI,
    ENV_FILE,
    ETC_HOSTS,
    HOST_PREFIX,
    HOSTS_BEGIN,
    HOSTS_END,
    IFNAME,
    LINK_PREFIX,
    LOCK_FD_ENV,
    LOCK_WAIT_S,
    MAX_HOSTS,
    NETNS_ETC,
    STATE_DIR,
    SUBNET,
    TCP_RETRIES2,
    Cluster,
    ClusterError,
    Host,
    exec_prefix,
    host,
    host_pids,
    kill_host,
    link_down,
    link_up,
    resolve_host,
    unavailable_reason,
)
from ._lifecycle import current, down, job_env, leftovers, read_env_file, shape, up
from ._measure import MEASURE_MAX_SECONDS, MEASURE_SECONDS, measure_tcp
from ._session import active, hold, lock_env, session
from ._shaping import (
    SHAPE_BURST_S,
    SHAPE_MIN_BURST,
    SHAPE_MIN_QUEUE,
    SHAPE_QUEUE_S,
    TCP_GOODPUT_SHARE,
    link_rates,
    tbf_params,
)

__all__ = [
    "AGENT",
    "BRIDGE",
    "BRIDGE_ADDRESS",
    "CLI",
    "ENV_FILE",
    "ETC_HOSTS",
    "HOSTS_BEGIN",
    "HOSTS_END",
    "HOST_PREFIX",
    "IFNAME",
    "LINK_PREFIX",
    "LOCK_FD_ENV",
    "LOCK_WAIT_S",
    "MAX_HOSTS",
    "MEASURE_MAX_SECONDS",
    "MEASURE_SECONDS",
    "NETNS_ETC",
    "SHAPE_BURST_S",
    "SHAPE_MIN_BURST",
    "SHAPE_MIN_QUEUE",
    "SHAPE_QUEUE_S",
    "STATE_DIR",
    "SUBNET",
    "TCP_GOODPUT_SHARE",
    "TCP_RETRIES2",
    "Cluster",
    "ClusterError",
    "Host",
    "active",
    "current",
    "down",
    "exec_prefix",
    "host",
    "host_pids",
    "job_env",
    "kill_host",
    "leftovers",
    "link_down",
    "link_rates",
    "link_up",
    "measure_tcp",
    "read_env_file",
    "resolve_host",
    "session",
    "hold",
    "lock_env",
    "shape",
    "tbf_params",
    "unavailable_reason",
    "up",
]
