"""The composed job (tools/train_recsys.py) on 1, 2 and 4 simulated hosts x 1 rank: strong scaling.

Run as root from a checkout, with every package installed in the interpreter's environment
(e.g. the venv of ``nox -s "tests(package='integration')"``)::

    python tools/bench_recsys_cluster.py --rate 1gbit            # 1, 2, 4 hosts (~5 min)
    python tools/bench_recsys_cluster.py --rate 1gbit --hosts 1,2 --steps 60

It brings up the simulated cluster (ci/cluster/README.md) with every host's link shaped to
``--rate``, measures the link in the same cluster (one TCP stream dkh1 -> dkh2 and
``MPI_Sendrecv`` of 1 MiB each way), then runs the job on each host count with the same global
batch (``--batch`` = global batch / hosts, ``--tp 1``: data parallel only; no evaluation or
checkpoint before the last step). It counts every host's bytes on its link (``/proc/net/dev`` of
``dk0`` inside the host, before and after the job) and prints BENCH lines: steps/s (rank 0's
plain steps after 10 of warm-up, from the job's summary.json), the speedup over 1 host and the
scaling efficiency (speedup / hosts), each with two bounds from the same run: the cores (the
hosts share this machine's cores: n ranks that each spend C CPU seconds per step cannot step
faster than cores / (n C); C is measured in the same run, so where the cores are saturated
this bound is met by construction and says that the cores, not the link, set the speed) and the link (the busiest host's bytes per step over the TCP goodput).
It writes ``recsys_scaling.png`` into ``--out`` (default results/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tools" / "train_recsys.py"


def bench_line(name: str, value: float | None, goal: str, met: bool | None, unit: str, **detail: object) -> str:
    row = {"package": "tools", "name": name, "ratio": None if value is None else round(value, 3)}
    return "BENCH " + json.dumps(row | {"goal": goal, "met": met, "unit": unit, "detail": detail})


def link_bytes(hosts: int) -> list[tuple[int, int]]:
    """(received, sent) bytes so far on every host's cluster interface ``dk0``."""
    from distkit_common.testing import cluster

    out = []
    for h in range(1, hosts + 1):
        text = subprocess.run(
            [*cluster.exec_prefix(h), "cat", "/proc/net/dev"], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        line = next(ln for ln in text.splitlines() if ln.strip().startswith("dk0:"))
        fields = line.split(":", 1)[1].split()
        out.append((int(fields[0]), int(fields[8])))
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="1gbit", help="every host link's rate, tc's syntax (default 1gbit)")
    p.add_argument("--hosts", default="1,2,4", help="comma-separated host counts, one rank each (default 1,2,4)")
    p.add_argument("--global-batch", type=int, default=512, help="samples per step over all hosts (default 512)")
    p.add_argument("--steps", type=int, default=200, help="steps per run (default 200)")
    p.add_argument("--out", type=Path, default=ROOT / "results", help="folder for the plot (default results/)")
    a = p.parse_args(argv)
    counts = [int(h) for h in a.hosts.split(",")]
    if not counts or any(n < 1 for n in counts) or any(a.global_batch % n for n in counts):
        p.error(f"--hosts must be positive counts dividing --global-batch {a.global_batch}, got {a.hosts!r}")
    if a.steps < 20:
        p.error(f"--steps must be >= 20 (10 of warm-up), got {a.steps}")

    from distkit_common.rates import parse_rate
    from distkit_common.testing import cluster, measure_mpi_sendrecv, run_cluster

    parse_rate(a.rate)
    reason = cluster.unavailable_reason()
    if reason:
        print(f"simulated cluster unavailable: {reason} (no measurement across hosts)", file=sys.stderr)
        return 0
    cores = os.cpu_count() or 1
    rows: dict[int, dict] = {}
    with cluster.session(max(max(counts), 2), a.rate), tempfile.TemporaryDirectory(prefix="recsys-scaling-") as tmp:
        tcp = cluster.measure_tcp(1, 2)
        print(
            bench_line(f"link at {a.rate}: one TCP stream dkh1 -> dkh2, payload", 8 * tcp / 1e6, "info", None, "Mbit/s")
        )
        mpi = measure_mpi_sendrecv((1, 2), 1 << 20, 5)
        print(
            bench_line(
                f"link at {a.rate}: MPI_Sendrecv of 1 MiB between dkh1 and dkh2, each way",
                8 * mpi["bytes_per_s"] / 1e6,
                "info",
                None,
                "Mbit/s",
                median_s=mpi["median_s"],
                best_s=mpi["best_s"],
            ),
            flush=True,
        )
        for n in counts:
            out = Path(tmp) / f"hosts{n}"
            args = ["--tp", "1", "--batch", str(a.global_batch // n), "--steps", str(a.steps)]
            args += ["--eval-every", str(a.steps), "--ckpt-every", str(a.steps), "--quiet", "--out", str(out)]
            before = link_bytes(n)
            run_cluster(n, 1, JOB, 900, args=args)  # asserts every rank exited 0
            after = link_bytes(n)
            s = json.loads((out / "summary.json").read_text())
            busiest = max(max(x1 - x0, y1 - y0) for (x0, y0), (x1, y1) in zip(before, after))
            rows[n] = {
                "steps_per_s": s["steps_per_s"],
                "cpu_s_per_step": s["cpu_s_per_step"],
                "link_bytes_per_step": busiest / a.steps,  # the whole job's traffic: setup and the last step's too
                "load_avg_1min": os.getloadavg()[0],
            }
            print(f"# {n} host(s): {json.dumps(rows[n])}", flush=True)
    base = rows.get(1)
    for n, r in rows.items():
        # bounds: the shared cores (n processes of C CPU seconds per step on `cores` cores) and the link
        core_bound = cores / (n * r["cpu_s_per_step"])
        link_bound = tcp / r["link_bytes_per_step"] if r["link_bytes_per_step"] > 0 else float("inf")
        detail = {
            "steps_per_s": round(r["steps_per_s"], 2),
            "cpu_ms_per_step_rank0": round(r["cpu_s_per_step"] * 1e3, 1),
            "steps_per_s_core_bound": round(core_bound, 2),
            "cores_busy": round(n * r["cpu_s_per_step"] * r["steps_per_s"], 2),
            "link_kB_per_step": round(r["link_bytes_per_step"] / 1e3, 1),
            "steps_per_s_link_bound": round(link_bound, 1) if link_bound != float("inf") else None,
            "link_MBps_tcp": round(tcp / 1e6, 1),
            "load_avg_1min": round(r["load_avg_1min"], 2),
            "global_batch": a.global_batch,
        }
        where = f"train_recsys {n} host(s) x 1 rank at {a.rate}, global batch {a.global_batch}"
        print(bench_line(f"{where}: steps/s", r["steps_per_s"], "info", None, "steps/s", **detail))
        if base and n > 1:
            speedup = r["steps_per_s"] / base["steps_per_s"]
            bound = min(core_bound, link_bound) / base["steps_per_s"]
            print(
                bench_line(
                    f"{where}: scaling efficiency (steps/s / (hosts x 1-host steps/s))",
                    speedup / n,
                    "info (bound: min(cores, link) / hosts, in detail)",
                    None,
                    "of linear",
                    speedup=round(speedup, 3),
                    speedup_bound=round(bound, 3),
                    efficiency_bound=round(bound / n, 3),
                    **detail,
                ),
                flush=True,
            )
    plot(rows, a.out / "recsys_scaling.png", a.rate, a.global_batch, cores, tcp)
    return 0


def plot(rows: dict[int, dict], path: Path, rate: str, batch: int, cores: int, tcp: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted(rows)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(ns, [rows[n]["steps_per_s"] for n in ns], marker="o", label="measured")
    if 1 in rows:
        ax.plot(ns, [rows[1]["steps_per_s"] * n for n in ns], ls="--", color="gray", label="linear")
    ax.plot(
        ns,
        [cores / (n * rows[n]["cpu_s_per_step"]) for n in ns],
        ls=":",
        color="C3",
        label=f"bound of {cores} shared cores",
    )
    linked = [n for n in ns if rows[n]["link_bytes_per_step"] > 1000]
    if linked:
        ax.plot(
            linked,
            [tcp / rows[n]["link_bytes_per_step"] for n in linked],
            ls="-.",
            color="C2",
            label="bound of the link (TCP goodput / bytes per step)",
        )
    ax.set(xlabel="hosts (1 rank each)", ylabel="steps/s", xticks=ns)
    ax.set_title(f"train_recsys, global batch {batch}, links {rate}", fontsize=10)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
