"""Which ranks share a node: one decision for every distkit package.

Two processes are on one node, and may share POSIX shared memory (wholemem's
HOST / CHUNKED / DEVICE tensors, kvps's co-located shards), only when they have
the same hostname, the same boot id (``/proc/sys/kernel/random/boot_id``: two
machines, or two boots of one machine, never share one) and the same ``/dev/shm``
(containers on one machine may each mount their own; their segments would then
be invisible to each other). Hostnames alone are not enough: containers and
cloud images reuse them; boot ids alone are not either: containers (and the
simulated cluster's hosts) on one machine share the kernel's.

The decision is made in C++ (``distkit/node.hpp``: ``distkit::node_key()``),
which kvps's engine calls directly; these functions call the same code.

Test switch: a non-empty ``$DISTKIT_NODE_ID`` (:data:`NODE_ID_ENV`) replaces the
key, so ranks of one machine with different values act as separate nodes. It
is read when a communicator or server is made, so a test may set it per rank
before that.
"""

from __future__ import annotations

from . import _distkit_common as _native

#: the test switch: ranks with different non-empty values act as separate nodes
NODE_ID_ENV: str = _native.NODE_ID_ENV

__all__ = ["NODE_ID_ENV", "node_key", "node_label"]


def node_key() -> str:
    """The key that is equal on exactly the processes that share this node.

    Returns
    -------
    str
        ``"<hostname>/<boot id>/<device>:<inode of /dev/shm>"``, or
        ``"override/<id>"`` when ``$DISTKIT_NODE_ID`` is set to a non-empty ``<id>``.

    See Also
    --------
    node_label : How messages name the node.

    Examples
    --------
    >>> import os
    >>> os.environ["DISTKIT_NODE_ID"] = "a"
    >>> node_key()
    'override/a'
    >>> del os.environ["DISTKIT_NODE_ID"]
    """
    return _native.node_key()


def node_label() -> str:
    """How error messages name this node.

    Returns
    -------
    str
        The hostname, or ``"node <id>"`` when ``$DISTKIT_NODE_ID`` is set to a non-empty ``<id>``.

    See Also
    --------
    node_key : The key that decides which ranks share a node.
    """
    return _native.node_label()
