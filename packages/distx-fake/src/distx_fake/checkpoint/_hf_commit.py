"""The commit of a safetensors export into a Hugging Face folder: all of it or none, after a kill anywhere.

What a Hugging Face loader reads (``from_pretrained``, ``safetensors.torch.load_file`` over
the index's files, :func:`load_safetensors`) is ``model.safetensors.index.json`` and the files
its ``weight_map`` names. The export therefore never writes to a file the current index
names: the new shards get names no live index uses, are written complete and fsynced (in a
staging folder inside the output folder, claimed through ``distkit_common.fsio``), renamed
beside the live ones, and the export is committed by one atomic ``rename`` of the new index
over the old one. A kill before that rename leaves the old index over its untouched files, a
kill after it the new index over complete new files; what is left beside them (the staging
folder of a dead writer, shards no index names) the next export removes.

Why not stage the whole folder and swap it in as the checkpoints do (``fsio.commit_dir``):
the output folder is the user's model folder, where ``config.json``, tokenizer files and the
like are written beside the weights (by ``save_pretrained``, by hand, before or after the
export). A folder exchange would drop them, and copying them over first races with whoever
writes them. Replacing the index keeps every other file where it is.

Names: the first export into a folder writes the standard ``model-0000k-of-0000n.safetensors``;
one that replaces an export using those names writes ``model-<8 hex>-0000k-of-0000n.safetensors``
(the next one the standard names again, and so on). Both are loaded through the index by every
Hugging Face loader; the second still matches the pattern ``save_pretrained`` cleans up
(``model-…-0000k-of-0000n``), so a later ``save_pretrained`` into the folder removes them as
it removes its own stale shards. A shard is removed only when its name has one of these two
forms and no index names it, the rule ``save_pretrained`` follows too; other files
(``model.safetensors``, adapters, ``*.bin``) are never touched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
from typing import Any

from distkit_common import fsio

INDEX = "model.safetensors.index.json"
#: the export's staging folders inside the output folder: ``.distx-export.tmp-<token>`` (``fsio.claim``)
STAGING = ".distx-export"
#: the file names of exported shards (standard, or with the token of a replacing export)
SHARD = re.compile(r"model(-[0-9a-f]{8})?-[0-9]{5}-of-[0-9]{5}\.safetensors")


def _indexed(folder: str) -> set[str] | None:
    """The file names the folder's index names (empty without an index), or None if it cannot be read."""
    try:
        with open(os.path.join(folder, INDEX), encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
    except FileNotFoundError:
        return set()
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(weight_map, dict):
        return None
    return {v for v in weight_map.values() if isinstance(v, str)}


class ExportCommit:
    """Write an export's shards where no loader looks, then commit them with the index.

    Used as a context manager around the whole export: entering locks the folder against
    another export (``flock``, released by the kernel when the process dies), removes what a
    dead export left and claims a staging folder; :meth:`commit` makes the export visible;
    leaving without it removes what this export wrote.

    Parameters
    ----------
    folder : str
        The output folder (created if needed).
    sync : bool
        Whether to fsync the folder around the commit (the caller fsyncs the shards).
    """

    def __init__(self, folder: str, sync: bool) -> None:
        self.folder = folder
        self.sync = sync
        self.stage = fsio.temporary_sibling(os.path.join(folder, STAGING))
        self.placed: list[str] = []  # shards renamed beside the live ones, not yet committed
        self.committed = False
        self._fd = -1

    def __enter__(self) -> ExportCommit:
        os.makedirs(self.folder, exist_ok=True)
        self._fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise RuntimeError(
                f"another export_safetensors is writing into {self.folder!r}; wait for it to finish"
            ) from None
        except OSError as e:
            # a filesystem without flock on folders (NFS emulates it with POSIX locks, which a
            # read-only descriptor cannot take): exports into one folder are then not serialized
            if e.errno not in (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
                os.close(self._fd)
                raise
        try:
            fsio.clean_stale(os.path.join(self.folder, STAGING))  # staging folders of dead exports
            live = _indexed(self.folder)
            if live is not None:  # unreadable index: keep every shard, it may name any of them
                self._remove_unindexed(live)
            fsio.claim(self.stage, 0)
        except BaseException:
            os.close(self._fd)
            raise
        return self

    def names(self, n: int) -> list[str]:
        """The file names of an export of ``n`` shards: standard unless the live index uses them.

        Parameters
        ----------
        n : int
            The number of shards.

        Returns
        -------
        list of str
            Names no live index names (the folder is locked, so none will until the commit).
        """
        standard = [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
        live = _indexed(self.folder)
        if live is None:
            live = {s for s in os.listdir(self.folder) if SHARD.fullmatch(s)}
        if live.isdisjoint(standard):
            return standard
        token = secrets.token_hex(4)
        return [f"model-{token}-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]

    def staged(self, name: str) -> str:
        """Where the file ``name`` is written before the commit (in the claimed staging folder).

        Parameters
        ----------
        name : str
            The file's final name.

        Returns
        -------
        str
            Its path in the staging folder.
        """
        return os.path.join(self.stage, name)

    def commit(self, shards: list[str], index: bytes) -> None:
        """Make the export visible: shards beside the live ones, then the index over the old one.

        Parameters
        ----------
        shards : list of str
            The shard names, their files complete (and fsynced when ``sync``) in the staging folder.
        index : bytes
            The index's JSON, naming exactly ``shards``.

        Raises
        ------
        OSError
            If a rename or a write fails (the previous export then still stands).
        """
        for name in shards:
            os.replace(self.staged(name), os.path.join(self.folder, name))
            self.placed.append(name)
        fsio.write_file(self.staged(INDEX), index, sync=self.sync)
        if self.sync:  # the shards' names are on disk before an index that names them
            fsio.fsync_path(self.folder)
        os.replace(self.staged(INDEX), os.path.join(self.folder, INDEX))  # the commit point
        self.committed = True
        if self.sync:
            fsio.fsync_path(self.folder)
        # the previous export's shards (or a killed one's): nothing names them any more
        self._remove_unindexed(set(shards))
        fsio.discard_claimed(self.stage)
        if self.sync:
            fsio.fsync_path(self.folder)

    def _remove_unindexed(self, keep: set[str]) -> None:
        for name in os.listdir(self.folder):
            if SHARD.fullmatch(name) and name not in keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.folder, name))

    def __exit__(self, *exc: Any) -> None:
        try:
            if not self.committed:
                for name in self.placed:  # renamed beside the live export, never named by an index
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.folder, name))
                fsio.discard_claimed(self.stage)
        finally:
            os.close(self._fd)  # releases the lock
