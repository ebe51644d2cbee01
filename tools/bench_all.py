"""`nox -s bench`: run every package's benchmarks and write results/REPORT.md.

Each benchmark script (packages/*/benchmarks/bench_*.py) prints one JSON line
per measurement, prefixed with ``BENCH ``:

    BENCH {"package": "mpiad", "name": "allreduce 1MiB vs mpi4py", "ratio": 1.02,
           "goal": "<= 1.05", "met": true, "unit": "x", "detail": {...}}

and may write PNG plots into the folder given by $DISTKIT_BENCH_OUT. This
driver launches each script (under mpiexec when its first line asks for
``# nprocs: N``), collects the lines and writes the report. A script with a
line ``# cluster: HxR ARGS...`` runs a second time on the simulated cluster
(H hosts x R ranks, ``distkit_common.testing.run_cluster``) with ARGS, where the
machine can host it (root, network namespaces; ci/cluster/README.md); elsewhere
that run is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from distkit_common.testing import RunResult, cluster, run_cluster, run_mpi

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results"


def nprocs_of(script: Path) -> int:
    m = re.search(r"^# nprocs: (\d+)", script.read_text(), re.M)
    return int(m.group(1)) if m else 1


def cluster_spec_of(script: Path) -> tuple[int, int, list[str]] | None:
    """(hosts, ranks per host, arguments) of the script's ``# cluster: HxR ARGS`` line, if any."""
    m = re.search(r"^# cluster: (\d+)x(\d+)(.*)$", script.read_text(), re.M)
    return (int(m.group(1)), int(m.group(2)), m.group(3).split()) if m else None


def run_on_cluster(script: Path, spec: tuple[int, int, list[str]]) -> RunResult | None:
    hosts, per_host, args = spec
    reason = cluster.unavailable_reason()
    if reason:
        print(f"   skipped on the simulated cluster: {reason}", flush=True)
        return None
    print(f"== {script.parent.parent.name}: {script.name} {' '.join(args)} on {hosts} hosts x {per_host}", flush=True)
    return run_cluster(hosts, per_host, script, 1800, args=args, check=False, env={"DISTKIT_BENCH_OUT": str(OUT)})


def main(argv: list[str]) -> int:
    only = set(argv)
    OUT.mkdir(exist_ok=True)
    rows: list[dict] = []
    failures: list[str] = []
    scripts = sorted(ROOT.glob("packages/*/benchmarks/bench_*.py"))
    for script in scripts:
        pkg = script.parent.parent.name
        if only and pkg not in only:
            continue
        n = nprocs_of(script)
        print(f"== {pkg}: {script.name} on {n} rank(s)", flush=True)
        t0 = time.monotonic()
        if n > 1:
            res = run_mpi(script, n, timeout=1800, check=False, env={"DISTKIT_BENCH_OUT": str(OUT)})
        else:  # a single process runs unbound (mpiexec would pin it to one core)
            proc = subprocess.run(
                [sys.executable, str(script)],
                capture_output=True,
                text=True,
                timeout=1800,
                env={**os.environ, "DISTKIT_BENCH_OUT": str(OUT)},
                stdin=subprocess.DEVNULL,
            )
            res = RunResult(proc.returncode, proc.stdout, proc.stderr)
        runs = [(script.name, res)]
        spec = cluster_spec_of(script)
        across = run_on_cluster(script, spec) if spec else None
        if across is not None:
            runs.append((f"{script.name} on the simulated cluster", across))
        for what, res in runs:
            sys.stdout.write(res.stdout)
            if res.returncode != 0:
                failures.append(f"{pkg}/{what} exited {res.returncode}")
                sys.stderr.write(res.stderr[-4000:])
            for line in res.stdout.splitlines():
                if line.startswith("BENCH "):
                    row = json.loads(line[6:])
                    row.setdefault("package", pkg)
                    rows.append(row)
        print(f"   ({time.monotonic() - t0:.0f} s)", flush=True)
    if only:  # a partial run refreshes those packages' rows and keeps everyone else's
        rows = [r for r in previous_rows() if r.get("package") not in only] + rows
        rows.sort(key=lambda r: str(r.get("package")))  # stable: each package keeps its own order
    write_report(rows, failures, only)
    return 1 if failures else 0


def previous_rows() -> list[dict]:
    """The measurements of the last report (empty when there is none or it does not parse)."""
    try:
        rows = json.loads((OUT / "results.json").read_text())
    except (OSError, ValueError):
        return []
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def write_report(rows: list[dict], failures: list[str], only: set[str] | frozenset[str] = frozenset()) -> None:
    lines = [
        "# distkit benchmark report",
        "",
        f"Machine: {os.cpu_count()} cores; generated {time.strftime('%Y-%m-%d %H:%M')}"
        + (f" (re-ran: {', '.join(sorted(only))}; the other rows are from the previous report)." if only else "."),
        "",
        "| package | measurement | ratio | goal | met |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ratio = r.get("ratio")
        shown = f"{ratio:.3g}" if isinstance(ratio, (int, float)) else str(ratio)
        met = {True: "met", False: "NOT met", None: "-"}[r.get("met")]
        lines.append(f"| {r['package']} | {r['name']} | {shown} {r.get('unit', '')} | {r.get('goal', '')} | {met} |")
    if failures:
        lines += ["", "## Failed benchmark runs", *[f"- {f}" for f in failures]]
    overview = plot_overview(rows)
    if overview:
        lines += ["", f"![every goal]({overview.name})"]
    pngs = sorted(p for p in OUT.glob("*.png") if p != overview)
    if pngs:
        lines += ["", "## Plots", *[f"![{p.stem}]({p.name})" for p in pngs]]
    (OUT / "REPORT.md").write_text("\n".join(lines) + "\n")
    (OUT / "results.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {OUT / 'REPORT.md'} ({len(rows)} measurements)")


def _goal(goal: str) -> tuple[str, float] | None:
    m = re.match(r"\s*(<=|>=|<|>)\s*([0-9.eE+-]+)", goal or "")
    return (m.group(1), float(m.group(2))) if m else None


def plot_overview(rows: list[dict]) -> Path | None:
    """One bar per measurement with a numeric goal: how far it is from its goal (1 = exactly at the goal,
    > 1 = better than the goal, whichever direction the goal points)."""
    items = []
    for r in rows:
        g = _goal(str(r.get("goal", "")))
        ratio = r.get("ratio")
        if g is None or not isinstance(ratio, (int, float)) or ratio <= 0 or g[1] <= 0:
            continue
        margin = ratio / g[1] if g[0].startswith(">") else g[1] / ratio
        items.append((f"{r['package']}: {r['name']}"[:70], margin))
    if not items:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.32 * len(items) + 1.2))
    labels = [i[0] for i in items][::-1]
    margins = [i[1] for i in items][::-1]
    ax.barh(labels, margins, color=["tab:green" if m >= 1 else "tab:red" for m in margins])
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("margin to goal (> 1: goal met)")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    path = OUT / "overview_goals.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
