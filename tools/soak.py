"""Soak: kvps, wholemem and mpiad on N MPI ranks for minutes, then exact results, flat resident
memory and no shared-memory segment left (`nox -s soak`; docs/development.md#soak).

    python tools/soak.py [--minutes 6] [--ranks 4] [--jobs kvps,wholemem,mpiad]

The minutes are split between the jobs (kvps half, the others a quarter each). Each job's ranks
(tools/soak/soak_<job>.py) check their results as they go, sample their resident set (VmRSS)
at the end of warm-up (the first third) and at the end, and record every /dev/shm file they
mapped. Here the job fails if a rank failed, if a rank's resident set grew by more than
--max-growth (5 %) after warm-up, if a segment a rank mapped still exists once the job ended,
or if Open MPI left a file in the job's private backing folder. Exit code 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distkit_common.testing import mpi_env, mpiexec_command

HERE = Path(__file__).resolve().parent / "soak"
SHARE = {"kvps": 0.5, "wholemem": 0.25, "mpiad": 0.25}
#: seconds a job may run past its own length before it is taken for hung (start-up on a loaded
#: machine: every rank imports torch; the last check; the teardown)
GRACE = 600.0


def _listing() -> set[str]:
    """The /dev/shm names of the kinds distkit makes (ShmSegment's default and wholemem's prefix)."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(("distkit-", "wholemem-")) and "-mpi-" not in n}
    except OSError:
        return set()


def run_job(job: str, seconds: float, ranks: int, out: Path) -> tuple[int, list[str]]:
    """Run one job under mpiexec, its output streamed; (exit code, files Open MPI left behind)."""
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    backing = tempfile.mkdtemp(prefix="distkit-soak-mpi-", dir=shm)
    keys = ("OMPI_MCA_btl_sm_backing_directory", "OMPI_MCA_osc_sm_backing_directory")
    env = mpi_env(dict.fromkeys(keys, backing))
    before = _listing()
    cmd = [*mpiexec_command(ranks), sys.executable, str(HERE / f"soak_{job}.py"), f"{seconds:.0f}", str(out)]
    print(f"[{job}] {' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        code = proc.wait(timeout=seconds + GRACE)
    except subprocess.TimeoutExpired:
        print(f"[{job}] still running {seconds + GRACE:.0f} s after its start: killed", flush=True)
        os.killpg(proc.pid, signal.SIGTERM)  # mpiexec forwards it to the ranks
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        code = -1
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the job
        except ProcessLookupError:
            pass
        proc.wait()
    # names of the kinds distkit makes that appeared while the job ran: other processes on a
    # shared machine make them too, so only those a rank mapped fail the job (judge)
    new = sorted(_listing() - before)
    if new:
        print(f"[{job}] note: {len(new)} distkit segments appeared in /dev/shm meanwhile (any process's): {new[:5]}")
    left = sorted(str(p.relative_to(backing)) for p in Path(backing).rglob("*") if p.is_file())
    shutil.rmtree(backing, ignore_errors=True)
    return code, left


def _kind(segment: str) -> str:
    """A segment's name without its random part (for the summary)."""
    name, unlinked = segment.removeprefix("/dev/shm/").removesuffix(" (deleted)"), segment.endswith(" (deleted)")
    kind = name.split("/")[0].rsplit("-", 1)[0] + "-*" + ("/..." if "/" in name else "")
    return kind + (" (unlinked while mapped)" if unlinked else "")


def judge(job: str, ranks: int, out: Path, max_growth: float) -> tuple[list[str], list[dict]]:
    """The failures of a finished job read from its ranks' figures, and the figures."""
    failures, figures = [], []
    for r in range(ranks):
        path = out / f"{job}-rank{r}.json"
        if not path.exists():
            failures.append(f"{job}: rank {r} wrote no figures (it failed; see its output above)")
            continue
        fig = json.loads(path.read_text())
        figures.append(fig)
        if fig["rss_warm"] is None:
            failures.append(f"{job}: rank {r} ended before warm-up did (run longer)")
            continue
        growth = fig["rss_end"] / fig["rss_warm"] - 1
        fig["growth"] = growth
        if growth > max_growth:
            failures.append(
                f"{job}: rank {r}'s resident set grew {100 * growth:.1f} % after warm-up "
                f"({fig['rss_warm'] / 2**20:.1f} -> {fig['rss_end'] / 2**20:.1f} MiB; at most {100 * max_growth:.0f} %)"
            )
        named = [s for s in fig["segments"] if not s.endswith(" (deleted)")]  # (unlinked ones are gone)
        still = [s for s in named if os.path.exists(s) and not s.startswith("/dev/shm/distkit-soak-mpi-")]
        fig["left"] = still
        if still:
            failures.append(f"{job}: rank {r} mapped {still}, which still exist after the job")
    return failures, figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=6.0, help="total length, split between the jobs (6)")
    p.add_argument("--ranks", type=int, default=4, help="MPI ranks of every job (4)")
    p.add_argument("--jobs", default=",".join(SHARE), help="comma-separated subset of kvps,wholemem,mpiad")
    p.add_argument("--max-growth", type=float, default=0.05, help="resident-set growth allowed after warm-up (0.05)")
    args = p.parse_args()
    jobs = [j for j in args.jobs.split(",") if j]
    if not jobs or any(j not in SHARE for j in jobs) or args.minutes <= 0 or args.ranks < 1:
        p.error(f"--jobs must name some of {list(SHARE)}, --minutes > 0, --ranks >= 1; got {args}")
    weight = sum(SHARE[j] for j in jobs)
    failures, rows = [], []
    with tempfile.TemporaryDirectory(prefix="distkit-soak-") as tmp:
        for job in jobs:
            seconds = 60 * args.minutes * SHARE[job] / weight
            out = Path(tmp) / job
            out.mkdir()
            t0 = time.monotonic()
            code, mpi_left = run_job(job, seconds, args.ranks, out)
            wall = time.monotonic() - t0
            if code != 0:
                failures.append(f"{job}: mpiexec exited with {code}")
            if mpi_left:
                failures.append(f"{job}: Open MPI left {mpi_left} in its backing folder")
            bad, figures = judge(job, args.ranks, out, args.max_growth)
            failures += bad
            for fig in figures:
                rows.append((job, wall, fig))
    print(
        "\n| job | rank | wall s | rounds | ops | RSS at warm-up MiB | RSS at end MiB | growth | segments mapped | left |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for job, wall, fig in rows:
        warm = f"{fig['rss_warm'] / 2**20:.1f}" if fig["rss_warm"] else "-"
        growth = f"{100 * fig['growth']:+.2f} %" if "growth" in fig else "-"
        print(
            f"| {job} | {fig['rank']} | {wall:.0f} | {fig['rounds']} | {sum(fig['ops'].values())} | {warm} | "
            f"{fig['rss_end'] / 2**20:.1f} | {growth} | {len(fig['segments'])} | {len(fig.get('left', []))} |"
        )
    for job, _, fig in rows:
        if fig["rank"] == 0:
            extra = {k: fig[k] for k in ("checks", "loads", "pushed") if k in fig}
            print(f"{job} rank 0 ops: {fig['ops']} {extra}")
            print(f"{job} rank 0 mapped: {sorted({_kind(s) for s in fig['segments']})}")
    if failures:
        print("\nSOAK FAILED:\n  " + "\n  ".join(failures), flush=True)
        return 1
    print(f"\nsoak passed: {', '.join(jobs)} on {args.ranks} ranks, {args.minutes:g} minutes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
