"""kvps's Zipf workload across hosts: intent vs the classic parameter server on 2 hosts x 2 ranks.

Run as root from a checkout with kvps installed in the interpreter's
environment (e.g. the kvps nox venv)::

    python packages/kvps/benchmarks/bench_kvps_cluster.py

It brings up distkit's simulated cluster (``ci/cluster/README.md``: network
namespaces dkh1, dkh2 on one machine, TCP between them), runs
``bench_kvps.py --zipf-across-hosts`` there with ranks 0-1 on dkh1 and 2-3 on
dkh2 (``distkit_common.testing.run_cluster``), removes the cluster again and
prints the job's BENCH lines (ratio = time without / with intent, goal >= 2x;
and the bound on that ratio: the classic server with every key homed where the
run uses it most, against hash placement).
``nox -s bench`` runs it too (where the machine cannot host the cluster it
says so and measures nothing).
On a real cluster run the same script directly:
``mpiexec --host a:2,b:2 -n 4 python bench_kvps.py --zipf-across-hosts``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from distkit_common import cluster
from distkit_common.testing import run_cluster


def main() -> int:
    reason = cluster.unavailable_reason()
    if reason:
        print(f"simulated cluster unavailable: {reason} (no measurement across hosts)", file=sys.stderr)
        return 0
    bench = Path(__file__).with_name("bench_kvps.py")
    res = run_cluster(2, 2, bench, 600, args=["--zipf-across-hosts"])
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("BENCH ")]
    print("\n".join(lines), flush=True)
    return 0 if lines else 1


if __name__ == "__main__":
    sys.exit(main())
