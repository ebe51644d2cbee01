"""Per-rank entry point of :func:`distkit_common.testing.run_cluster`.

``python -m distkit_common.testing._cluster_rank TARGET [ARGS...]`` runs TARGET as
``python TARGET ARGS`` would (or ``pytest TARGET ARGS`` for a ``test_*.py``
file) and records, in ``$DISTKIT_CLUSTER_STATUS_DIR``, this rank's pid and
host when it starts and its exit code when it ends. The launcher's own exit
code is not enough to assert every rank's: Open MPI's launcher exits 0 when it
loses a whole host, and a rank killed by a signal leaves no code at all (its
missing status file says so).
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
from pathlib import Path

from distkit_common.launch import launch_info

STATUS_DIR_ENV = "DISTKIT_CLUSTER_STATUS_DIR"


def is_pytest_file(target: str) -> bool:
    """True for a file pytest would collect (``test_*.py`` / ``*_test.py``)."""
    name = Path(target).name
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def _write(folder: str | None, name: str, text: str) -> None:
    if not folder:
        return
    path = Path(folder) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a reader never sees half a file


def _run(target: str, args: list[str]) -> int:
    if is_pytest_file(target):
        import pytest

        return int(pytest.main([target, *args]))
    sys.argv = [target, *args]
    sys.path[0] = str(Path(target).resolve().parent)  # as `python target` would
    try:
        runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(exc.code, file=sys.stderr)
        return 1
    return 0


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m distkit_common.testing._cluster_rank TARGET [ARGS...]", file=sys.stderr)
        sys.exit(2)
    target, args = sys.argv[1], sys.argv[2:]
    folder = os.environ.get(STATUS_DIR_ENV)
    rank = launch_info().rank
    _write(folder, f"start-{rank}", f"{os.getpid()} {socket.gethostname()}\n")
    code = 1
    try:
        code = _run(target, args)
    finally:
        # written before an exception propagates (mpi4py then aborts the job)
        _write(folder, f"exit-{rank}", f"{code}\n")
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
