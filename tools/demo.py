"""`nox -s demo`: the composed training job on 4 MPI ranks.

Runs tools/train_recsys.py (the job that composes all five packages) under
mpiexec. Extra arguments are passed to the job.
"""

from __future__ import annotations

import sys
from pathlib import Path

from distkit_common.testing import run_mpi

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    nprocs = 4
    if argv[:1] == ["-n"] and len(argv) >= 2:
        nprocs, argv = int(argv[1]), argv[2:]
    job = HERE / "train_recsys.py"
    if not job.exists():
        job = HERE / "smoke.py"
    res = run_mpi(job, nprocs, args=argv, timeout=900, check=False)
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    return res.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
