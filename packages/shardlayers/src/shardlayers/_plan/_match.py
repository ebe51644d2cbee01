"""Plan keys -> module names.

A key is a module name relative to the parallelized module, or a pattern: ``*`` (and ``?``,
``[...]``) match inside one name component, as in DTensor's ``parallelize_module``
(``"model.layers.*.self_attn.q_proj"``); a leading ``"*."`` matches any number of leading
components (``"*.mlp.down_proj"`` is every ``mlp.down_proj``, at any depth).
"""

from __future__ import annotations

import difflib
from fnmatch import fnmatchcase


def _match(pattern: str, name: str) -> bool:
    pat = pattern.split(".")
    parts = name.split(".")
    if pat[0] == "*" and len(pat) > 1:
        tail = pat[1:]
        return len(parts) > len(tail) and all(fnmatchcase(n, p) for n, p in zip(parts[-len(tail) :], tail))
    return len(pat) == len(parts) and all(fnmatchcase(n, p) for n, p in zip(parts, pat))


def match_plan(keys: list[str], names: list[str]) -> dict[str, list[str]]:
    """For every key, the module names it matches (in module order).

    Raises
    ------
    TypeError
        If a key is not a string.
    ValueError
        If a key matches no module (the message names the closest module names).
    """
    out: dict[str, list[str]] = {}
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"plan keys must be module names or patterns (str), got {key!r}")
        hits = [n for n in names if _match(key, n)]
        if not hits:
            close = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
            hint = f"; closest module names: {close}" if close else ""
            raise ValueError(f"plan key {key!r} matches no module{hint}")
        out[key] = hits
    return out
