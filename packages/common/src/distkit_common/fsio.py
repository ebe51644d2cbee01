"""Atomic directory commits: write beside, make durable, swap in, clean up after crashes.

A checkpoint (distx-fake) or a server's saved state (kvps) is a folder written
by several processes. Readers must see either the previous folder or the new
one, never a half-written one, even if a writer is killed. The recipe:

1. write everything into a temporary sibling ``<path>.tmp-<random>``
   (:func:`temporary_sibling`), each writer first leaving an owner marker in it
   (:func:`claim`: host, boot id, pid and process start time). :func:`claim`
   also creates the folder, and never lets it exist unclaimed, even for a
   moment: it is made under a name that records its creator
   (``<tmp>.own-<pid>-<start>-<host and boot hashes>-<random>``), given its
   marker there and renamed into place; a writer joining a folder another one
   made moves its finished marker in by a rename. (Made first and claimed
   after, a writer killed in between left an empty folder that no record
   tied to a dead process, and that no save could ever remove.)
2. make the files durable (:func:`write_file` or the caller's own ``fsync``);
3. :func:`commit_dir`: fsync the folder, swap it with ``path`` atomically
   (``renameat2(RENAME_EXCHANGE)`` where the filesystem has it, else two
   renames with a tiny window without ``path``), remove the previous folder,
   fsync the parent, drop the markers;
4. before the next save, :func:`clean_stale` removes the temporary siblings
   left by writers that provably died; first, :func:`recover` moves the
   previous folder back to ``path`` if a writer died inside the fallback's
   window (``path`` renamed away, the new folder not yet in place; loaders call
   it too when ``path`` is missing). :func:`remove_claimed` renames a folder
   to a name recording the remover before it drops the last marker, so a
   remover killed there leaves a folder that is still tied to a dead process.

"Provably dead" is decided on the writer's own host only: the marker names a
host, and a folder whose writer ran on another host (a shared filesystem in a
cluster) is never removed, since this host cannot see that process.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable
from typing import Any

from . import _distkit_common as _native

#: file name prefix of the owner markers inside a temporary folder
MARKER_PREFIX = ".distkit-owner-rank"
#: the part of a temporary sibling's name between the target's name and the random token
TMP_INFIX = ".tmp-"
#: the marker :func:`commit_dir` leaves in the folder it replaces (removed with that folder)
REPLACER_MARKER = MARKER_PREFIX + "-replacer.json"
#: what :func:`claim` and :func:`remove_claimed` append to a folder's name to record the process that
#: creates or removes it: ``.own-<pid>-<start>-<8 hex of the host name><8 hex of the boot id>-<random>``
OWNED_INFIX = ".own-"
_OWNED = re.compile(r"\.own-(?P<pid>[0-9]+)-(?P<start>[0-9]*)-(?P<host>[0-9a-f]{8})(?P<boot>[0-9a-f]{8})-[0-9a-f]+$")

PathLike = str | os.PathLike[str]


def fsync_path(path: PathLike) -> None:
    """Flush a file or a directory to disk by path (fsync).

    Parameters
    ----------
    path : path
        The file or directory.

    Raises
    ------
    OSError
        If it cannot be opened or synced (errno kept).
    """
    _native.fsync_path(os.fspath(path))


def write_file(path: PathLike, data: bytes, *, sync: bool = True) -> None:
    """Write ``data`` to a new file and (by default) fsync it before returning.

    Parameters
    ----------
    path : path
        The file to write (created, or truncated if it exists).
    data : bytes
        Its contents.
    sync : bool
        Whether to fsync the file before returning.

    Raises
    ------
    OSError
        On any write or sync failure.
    """
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def temporary_sibling(path: PathLike, token: str | None = None) -> str:
    """Name the folder to write into before :func:`commit_dir`: ``<path>.tmp-<token>``.

    ``token`` defaults to 16 random hex digits; ranks that write together agree
    on one (rank 0 draws it and broadcasts it).

    Parameters
    ----------
    path : path
        The destination.
    token : str, optional
        The suffix; 16 random hex digits when None.

    Returns
    -------
    str
        ``<path>.tmp-<token>``.
    """
    return f"{os.fspath(path)}{TMP_INFIX}{token or secrets.token_hex(8)}"


# ------------------------------------------------------------------ ownership
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _proc_start(pid: int) -> str | None:
    """Start time of ``pid`` (clock ticks since boot), ``None`` if there is no such
    process, ``""`` if it exists but cannot be read. A zombie counts as gone: it
    will never write again."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return ""
    # the command name may hold spaces and parentheses: fields start after the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields and fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else ""


def owner_record() -> dict[str, Any]:
    """Describe this process as written into a marker.

    Returns
    -------
    dict
        ``{"host", "boot_id", "pid", "start"}``: hostname, boot id, pid and the
        process's start time (``/proc/<pid>/stat``; ``""`` where unreadable).
    """
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": pid, "start": _proc_start(pid) or ""}


def _tag(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _owned_name(folder: str) -> str:
    """``folder``'s name (without an earlier owner suffix) followed by one that records this process."""
    rec = owner_record()
    base = _OWNED.sub("", folder)
    tags = _tag(rec["host"]) + _tag(rec["boot_id"])
    return f"{base}{OWNED_INFIX}{rec['pid']}-{rec['start']}-{tags}-{secrets.token_hex(2)}"


def _name_owner(folder: str) -> dict[str, Any] | None:
    """The owner record a folder's name holds (see :data:`OWNED_INFIX`), in the form
    :func:`owner_alive` takes, or ``None`` if the name holds none."""
    m = _OWNED.search(os.path.basename(folder))
    if m is None:
        return None
    here = owner_record()
    same_host = m["host"] == _tag(here["host"])
    return {
        "host": here["host"] if same_host else None,  # another host's (or an unknown) writer stays alive
        "boot_id": here["boot_id"] if m["boot"] == _tag(here["boot_id"]) else "other-boot-" + m["boot"],
        "pid": int(m["pid"]),
        "start": m["start"],
    }


def claim(tmp: PathLike, rank: int) -> None:
    """Create ``tmp`` unless it exists, and record in it that this process (as ``rank``) writes into it.

    ``tmp`` is never, not even for a moment, a folder without a complete marker:
    it is created under a name that records this process (:data:`OWNED_INFIX`),
    given its marker there and renamed into place; if ``tmp`` exists already
    (another rank made it), the finished marker is moved into it by a rename.
    A process killed at any point leaves only folders that :func:`clean_stale`
    can tie to it. Missing parent folders are created.

    Parameters
    ----------
    tmp : path
        The temporary folder (see :func:`temporary_sibling`).
    rank : int
        This process's rank among the writers, recorded in its marker.

    Raises
    ------
    OSError
        If the folder or the marker cannot be made (``NotADirectoryError`` if
        ``tmp`` is a file).
    """
    tmp = os.fspath(tmp)
    marker = f"{MARKER_PREFIX}{int(rank)}.json"
    staging = _owned_name(tmp)
    os.makedirs(os.path.dirname(staging) or ".", exist_ok=True)
    os.mkdir(staging)
    try:
        write_file(os.path.join(staging, marker), json.dumps(owner_record()).encode(), sync=False)
        try:
            os.rename(staging, tmp)  # tmp appears with its marker (an empty tmp is replaced)
            return
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        os.replace(os.path.join(staging, marker), os.path.join(tmp, marker))
        os.rmdir(staging)
    except BaseException:
        with contextlib.suppress(OSError):
            remove_claimed(staging)
        raise


def owner_alive(record: Any) -> bool:
    """Tell whether the recorded writer may still run (False only if it provably does not).

    It must have run on this host (same hostname) and either the host rebooted
    since (other boot id), or its pid is gone, a zombie, or reused by a process
    that started later. Anything else (another host, an unreadable record)
    counts as alive.

    Parameters
    ----------
    record : object
        An owner record as :func:`owner_record` writes it (anything else counts as alive).

    Returns
    -------
    bool
        False only if the recorded writer provably no longer runs.
    """
    if not isinstance(record, dict) or record.get("host") != socket.gethostname():
        return True
    boot = _boot_id()
    if boot and record.get("boot_id") and record["boot_id"] != boot:
        return False
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return True
    start = _proc_start(pid)
    if start is None:
        return False
    return not (start and record.get("start") and start != record["start"])


def is_abandoned(tmp: PathLike) -> bool:
    """Tell whether every writer recorded for ``tmp`` is provably dead (see :func:`owner_alive`).

    The records are the owner markers in it and, for a folder being created by
    :func:`claim` or removed by :func:`remove_claimed`, its name. A folder
    recording nobody (foreign) is not abandoned, nor is one with an unreadable
    marker, unless its name records a dead process (only that process can have
    written a marker there that is not yet complete).

    Parameters
    ----------
    tmp : path
        A temporary folder.

    Returns
    -------
    bool
        True only when it may be removed.
    """
    tmp = os.fspath(tmp)
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(MARKER_PREFIX)]
    except OSError:
        return False
    by_name = _name_owner(tmp)
    if by_name is None and not names:
        return False
    if by_name is not None and owner_alive(by_name):
        return False
    for n in names:
        try:
            with open(os.path.join(tmp, n), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            if by_name is None:
                return False
            continue
        if owner_alive(rec):
            return False
    return True


#: the token prefix of the name :func:`commit_dir`'s two-rename fallback moves the replaced folder to
OLD_TOKEN = "old-"


def recover(path: PathLike) -> str | None:
    """Put the previous folder back at ``path`` if a writer died between the fallback's two renames.

    Without ``RENAME_EXCHANGE``, :func:`commit_dir` renames ``path`` to
    ``<path>.tmp-old-<random>`` and then the new folder to ``path``; a writer
    killed in between left no folder at ``path`` and the previous one under the
    temporary name, which :func:`clean_stale` would then have removed as a dead
    writer's temporary. When ``path`` is missing and such a folder's writer
    provably died, it is renamed back (the newest if there are several) and its
    replacer marker dropped. A live save's window is left alone.

    Parameters
    ----------
    path : path
        The destination.

    Returns
    -------
    str or None
        The folder moved back to ``path``, or None.
    """
    path = os.fspath(path)
    if os.path.lexists(path):
        return None
    parent, base = os.path.split(path)
    prefix = base + TMP_INFIX + OLD_TOKEN
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return None
    found = []
    for n in names:
        full = os.path.join(parent, n)
        # (a name with an owner suffix is a folder being removed, not the previous checkpoint)
        if (
            n.startswith(prefix)
            and not _OWNED.search(n)
            and os.path.isdir(full)
            and not os.path.islink(full)
            and os.path.exists(os.path.join(full, REPLACER_MARKER))
            and is_abandoned(full)
        ):
            with contextlib.suppress(OSError):
                found.append((os.stat(full).st_mtime_ns, full))
    for _, full in sorted(found, reverse=True):
        try:
            os.rename(full, path)
        except OSError:  # another process moved one back first: keep that one
            return None
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(path, REPLACER_MARKER))
        with contextlib.suppress(OSError):
            fsync_path(parent or ".")
        return full
    return None


def clean_stale(path: PathLike) -> list[str]:
    """Remove the ``<path>.tmp-*`` folders whose writers all died on this host; return them.

    :func:`recover` runs first, so a previous folder renamed away by a killed
    fallback commit goes back to ``path`` instead. A live save (on this host or another) and unmarked folders are left alone;
    links are never followed.

    Parameters
    ----------
    path : path
        The destination whose temporaries (``<path>.tmp-*``) are looked at.

    Returns
    -------
    list of str
        The folders removed.
    """
    recover(path)
    parent, base = os.path.split(os.fspath(path))
    prefix = base + TMP_INFIX
    removed: list[str] = []
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return removed
    for n in names:
        full = os.path.join(parent, n)
        if n.startswith(prefix) and os.path.isdir(full) and not os.path.islink(full) and is_abandoned(full):
            with contextlib.suppress(OSError):
                remove_claimed(full)
            removed.append(full)
    return removed


def discard_claimed(tmp: PathLike) -> None:
    """:func:`remove_claimed` after a failed save, ignoring every error.

    What cannot be removed now (the folder is gone already, a file is busy)
    stays claimed, so :func:`clean_stale` removes it once its writers are gone;
    ``shutil.rmtree`` could remove the markers first and leave an unmarked
    remainder that nobody may remove.
    """
    with contextlib.suppress(OSError):
        remove_claimed(tmp)


def remove_claimed(tmp: PathLike) -> None:
    """Remove a claimed folder, its owner markers last.

    A process killed midway leaves the folder still claimed, so that
    :func:`clean_stale` finishes the job: everything but the markers goes
    first, then the folder is renamed to a name recording this process
    (:data:`OWNED_INFIX`), then the markers and the folder go. Removed in any
    order, the markers could go first and leave an unmarked remainder that
    nobody may remove; and without the rename, a kill between the last marker
    and the folder itself left an empty folder tied to no process.

    Parameters
    ----------
    tmp : path
        The claimed folder.

    Raises
    ------
    OSError
        If an entry cannot be removed (``FileNotFoundError`` if ``tmp`` does not exist).
    """
    tmp = os.fspath(tmp)
    names = os.listdir(tmp)
    markers = [n for n in names if n.startswith(MARKER_PREFIX)]
    for n in names:
        if n in markers:
            continue
        full = os.path.join(tmp, n)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
        else:
            os.unlink(full)
    owned = _owned_name(tmp)
    os.rename(tmp, owned)
    for n in markers:
        os.unlink(os.path.join(owned, n))
    os.rmdir(owned)


def drop_claims(path: PathLike) -> None:
    """Remove the owner markers from a committed folder (it is nobody's temporary any more).

    Parameters
    ----------
    path : path
        The committed folder. Errors are ignored (a marker left behind is harmless).
    """
    with contextlib.suppress(OSError):
        for n in os.listdir(path):
            if n.startswith(MARKER_PREFIX):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(path, n))


# ------------------------------------------------------------------ commit
def commit_dir(
    tmp: PathLike,
    path: PathLike,
    *,
    sync: bool = True,
    replaceable: Callable[[str], bool] | None = None,
) -> None:
    """Atomically make the folder ``tmp`` appear at ``path``, replacing what was there.

    Parameters
    ----------
    tmp : path
        The finished temporary folder (see :func:`temporary_sibling`); its files
        must already be durable when ``sync``.
    path : path
        The destination. An existing folder there is replaced and removed.
    sync : bool
        Whether to fsync ``tmp`` before the swap and the parent after it.
    replaceable : callable, optional
        Called with ``path`` when it exists; returning False refuses to replace it
        (e.g. a folder that is not a checkpoint of this format).

    Raises
    ------
    FileExistsError
        ``path`` exists and ``replaceable`` refused it.
    OSError
        Any filesystem failure (``path`` then still holds the previous folder,
        except in the two-rename fallback's window).
    """
    tmp, path = os.fspath(tmp), os.fspath(path)
    parent = os.path.dirname(path) or "."
    if sync:
        fsync_path(tmp)
    if os.path.lexists(path):
        if replaceable is not None and not replaceable(path):
            raise FileExistsError(f"{path!r} exists and is not replaceable by this save; refusing to replace it")
        if os.path.isdir(path) and not os.path.islink(path):
            # the previous folder, once swapped out to a temporary name, must be claimed by this
            # process: killed before it is removed, it is then a dead writer's temporary that
            # the next save's clean_stale removes (an unmarked one would stay for good)
            write_file(os.path.join(path, REPLACER_MARKER), json.dumps(owner_record()).encode(), sync=False)
        if _native.exchange_paths(tmp, path):
            remove_claimed(tmp)  # it now holds the previous folder
        else:
            old = temporary_sibling(path, OLD_TOKEN + secrets.token_hex(4))
            os.rename(path, old)
            os.rename(tmp, path)
            remove_claimed(old)
    else:
        os.rename(tmp, path)
    drop_claims(path)
    if sync:
        fsync_path(parent)


__all__ = [
    "MARKER_PREFIX",
    "OLD_TOKEN",
    "OWNED_INFIX",
    "REPLACER_MARKER",
    "TMP_INFIX",
    "claim",
    "clean_stale",
    "commit_dir",
    "drop_claims",
    "fsync_path",
    "is_abandoned",
    "owner_alive",
    "owner_record",
    "recover",
    "remove_claimed",
    "temporary_sibling",
    "write_file",
]
