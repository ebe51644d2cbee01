"""A light tree map over the tuples, lists and dicts found in aten arguments and results."""

from __future__ import annotations

from typing import Any


def _map(fn: Any, x: Any) -> Any:
    """A light tree_map over the tuples/lists/dicts found in aten arguments and results."""
    t = type(x)
    if t is tuple or t is list:
        return t(_map(fn, v) for v in x)
    if t is dict:
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x)


def _leaves(x: Any, out: list[Any] | None = None) -> list[Any]:
    """The leaves of nested tuples/lists/dicts, in :func:`_map` order."""
    if out is None:
        out = []
    t = type(x)
    if t is tuple or t is list:
        for v in x:
            _leaves(v, out)
    elif t is dict:
        for v in x.values():
            _leaves(v, out)
    else:
        out.append(x)
    return out
