"""Atomic directory commit and the cleanup of temporary folders left by crashed saves.

Every writer records itself (host, boot id, pid, process start time) in a marker file inside
the temporary folder; a later save removes ``<path>.tmp-*`` folders only when every writer is
provably gone on this host. The commit swaps the new folder with the old checkpoint atomically
(``renameat2(RENAME_EXCHANGE)``; two renames where the filesystem lacks it).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
from typing import Any

from .. import _distx_fake as _native
from ._metadata import METADATA

_MARKER_PREFIX = ".distx-owner-rank"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _proc_start(pid: int) -> str | None:
    """Start time of ``pid`` (clock ticks since boot) or None if there is no such process.

    A zombie counts as gone: it will never write again.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return ""  # exists but unreadable
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields and fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else ""


def _owner_record() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": pid, "start": _proc_start(pid) or ""}


def write_marker(tmp: str, rank: int) -> None:
    """Record which process writes into ``tmp`` (read by :func:`_is_abandoned`)."""
    with open(os.path.join(tmp, f"{_MARKER_PREFIX}{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(_owner_record(), f)


def _owner_alive(rec: Any) -> bool:
    """False only if the recorded owner provably no longer runs (same host, pid gone)."""
    if not isinstance(rec, dict) or rec.get("host") != socket.gethostname():
        return True  # another host (or garbage): cannot tell
    boot = _boot_id()
    if boot and rec.get("boot_id") and rec["boot_id"] != boot:
        return False  # written before this host rebooted
    pid = rec.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return True
    start = _proc_start(pid)
    if start is None:
        return False
    # the pid exists: still the owner unless the pid was reused by a later process
    return not (start and rec.get("start") and start != rec["start"])


def _is_abandoned(tmp: str) -> bool:
    """True if every process that wrote into ``tmp`` is provably dead on this host."""
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(_MARKER_PREFIX)]
    except OSError:
        return False
    if not names:
        return False  # no owner recorded (foreign folder, or created a moment ago)
    for n in names:
        try:
            with open(os.path.join(tmp, n), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return False
        if _owner_alive(rec):
            return False
    return True


def clean_stale_tmp(path: str) -> list[str]:
    """Remove the ``<path>.tmp-*`` folders left by saves whose processes died; return them.

    Only folders whose ownership markers all name processes of this host that no longer run
    are removed; a live save (here or on another host) and unmarked folders are left alone.
    """
    parent, base = os.path.split(path)
    prefix = base + ".tmp-"
    removed: list[str] = []
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return removed
    for n in names:
        full = os.path.join(parent, n)
        if n.startswith(prefix) and os.path.isdir(full) and not os.path.islink(full) and _is_abandoned(full):
            shutil.rmtree(full, ignore_errors=True)
            removed.append(full)
    return removed


def drop_markers(path: str) -> None:
    """Remove the owner markers from a committed checkpoint."""
    with contextlib.suppress(OSError):
        for n in os.listdir(path):
            if n.startswith(_MARKER_PREFIX):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(path, n))


def commit(tmp: str, path: str, sync: bool) -> None:
    """Make ``tmp`` the checkpoint at ``path`` atomically and remove the previous one.

    Raises
    ------
    FileExistsError
        If ``path`` exists, is not empty and is not a checkpoint (never replaced).
    """
    parent = os.path.dirname(path) or "."
    if sync:
        _native.fsync_path(tmp)
    if os.path.exists(path):
        if not os.path.exists(os.path.join(path, METADATA)) and os.listdir(path):
            raise FileExistsError(f"{path!r} exists and is not a distx-fake checkpoint; refusing to replace it")
        if _native.exchange_paths(tmp, path):
            shutil.rmtree(tmp)  # now holds the previous checkpoint
        else:  # no RENAME_EXCHANGE on this filesystem: two renames (a tiny window without `path`)
            old = f"{path}.old-{secrets.token_hex(4)}"
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old)
    else:
        os.rename(tmp, path)
    if sync:
        _native.fsync_path(parent)
