"""Run several of these worker scripts one after another in the same MPI job.

``mpiexec -n 4 python -m mpi4py run_scripts.py grads.py nonblocking.py ...``:
each script runs as ``python script`` would (``runpy``, as ``__main__``, its
own arguments after a ``:``, e.g. ``large_counts.py:small``), with a barrier
between scripts. One job instead of one per script saves the processes' start
(torch's import is most of a short job on a loaded machine), which matters
most across simulated hosts. A failing check raises, and ``python -m mpi4py``
turns it into an abort of the whole job.
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

import mpi4py.MPI as MPI

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: run_scripts.py SCRIPT[:ARG,...] ...")
    world = MPI.COMM_WORLD
    saved = list(sys.argv)
    for spec in argv:
        name, _, rest = spec.partition(":")
        path = HERE / name
        if not path.is_file():
            raise SystemExit(f"no such worker script: {path}")
        t0 = time.perf_counter()
        sys.argv = [str(path), *(a for a in rest.split(",") if a)]
        runpy.run_path(str(path), run_name="__main__")
        world.Barrier()
        if world.rank == 0:
            print(f"run_scripts: {spec} done in {time.perf_counter() - t0:.1f} s", flush=True)
    sys.argv = saved


if __name__ == "__main__":
    main(sys.argv[1:])
