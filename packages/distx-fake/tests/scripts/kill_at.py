"""One save of crash_writer.state(argv[2]) to argv[1] that SIGKILLs itself at the point argv[3] names.

``claim``: the first write of an owner marker into a writer's temporary folder (the folder is made,
its marker not yet); ``remove``: the removal (``os.rmdir``) of a temporary folder once its files
and markers are gone (the replaced checkpoint, after the swap). For test_checkpoint's regression
tests of those two windows.
"""

from __future__ import annotations

import os
import signal
import sys

import crash_writer

from distkit_common import fsio
from distx_fake import checkpoint as cp


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(path: str, gen: int, point: str) -> None:
    base = os.path.basename(path) + fsio.TMP_INFIX
    if point == "claim":
        write_file = fsio.write_file

        def killed_write(p: str, data: bytes, *, sync: bool = True) -> None:
            name = os.path.basename(p)
            if name.startswith(fsio.MARKER_PREFIX) and name != fsio.REPLACER_MARKER:
                _die()
            write_file(p, data, sync=sync)

        fsio.write_file = killed_write  # type: ignore[assignment]
    elif point == "remove":
        rmdir = os.rmdir

        def killed_rmdir(p: str, *args: object, **kwargs: object) -> None:
            if os.path.basename(os.fspath(p)).startswith(base):
                _die()
            rmdir(p, *args, **kwargs)  # type: ignore[arg-type]

        os.rmdir = killed_rmdir  # type: ignore[assignment]
    else:
        raise ValueError(f"unknown kill point {point!r}")
    cp.save_state_dict(crash_writer.state(gen), cp.FileSystemWriter(path, piece_bytes=256 << 10))
    print("not killed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
