"""AdaPM's kinds of workload across hosts: kvps with intent vs the classic parameter server vs an oracle placement.

Run as root from a checkout with kvps installed in the interpreter's
environment (e.g. the kvps nox venv)::

    python packages/kvps/benchmarks/bench_kvps_cluster.py                     # every row (~15-20 min)
    python packages/kvps/benchmarks/bench_kvps_cluster.py --rates 100mbit --hosts 2 --workloads mf

For every link rate it brings up distkit's simulated cluster
(``ci/cluster/README.md``: network namespaces dkh1..dkhN on one machine, TCP
between them) with every host's link shaped to that rate, measures the link
itself (one TCP stream and ``MPI_Sendrecv`` of 4 MiB between two hosts: the
bound), then runs this script's rank side on 2 and on 4 hosts, one rank per
host (``distkit_common.testing.run_cluster``), removes the cluster and prints
the job's BENCH lines. Workloads (``workloads.py``):

* ``mf``: partitioned matrix factorisation: each rank its own 20k rows (homed
  by hash on another rank), 1024 of them per step plus 512 of 2k columns
  shared by all ranks;
* ``kge``: knowledge-graph embeddings: 1024 triples per step, heads and tails
  Zipf(1.1) over 200k entities, plus all 300 relations every step;
* ``w2v``: word2vec-like: 1024 Zipf(1.1) words and 1024 uniform negative
  samples per step over a 200k vocabulary (input and output vectors);
* ``zipf``: ``bench_kvps.py``'s Zipf(1.1) batches (4096 draws of 200k keys),
  each rank its own hot keys.

Every step pulls its keys (dim 64, float32), pushes a gradient back
asynchronously and advances the clock; the intent variant signals each
step's keys 16 clocks ahead. Variants, alternated within each round (the
order rotates): classic (``use_techniques="none"``), intent (``"all"``), and
the oracle: the classic server with the keys relabelled so that kvps's hash
placement homes every key on the rank that uses it most over the whole run
(perfect foresight, free moves). Rows give medians of per-round ratios.
``nox -s bench -- kvps`` runs every row (where the machine cannot host the
cluster it says so and measures nothing).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: link rates: tc's rate for every host's link (``distkit_common.testing.cluster.session(n, rate)``), or None (unshaped)
RATES: dict[str, str | None] = {"100mbit": "100mbit", "1gbit": "1gbit", "10gbit": "10gbit", "unshaped": None}
WORKLOADS = ("mf", "kge", "w2v", "zipf")
HOSTS = (2, 4)
AHEAD = 16


@dataclass(frozen=True)
class Plan:
    """Steps and rounds of every row at one rate (the timed part is the last two thirds of the steps)."""

    steps: int
    rounds: int


#: Every row times the steady state after the ledger's first judgement (clock 84 at a lookahead of 16,
#: ledger.hpp; workloads.zipf_warm): 100 steps of warm-up, 110 timed. At 100 Mbit/s the classic server runs 8-19 steps/s (its MF rows
#: cross the link: ~750 kB per host and step on 2 hosts, ~820 kB on 4), so one round there; at the other rates the
#: 2 shared cores bound it (17-66 steps/s).
PLANS: dict[str, Plan] = {
    "100mbit": Plan(210, 1),
    "1gbit": Plan(210, 2),
    "10gbit": Plan(210, 2),
    "unshaped": Plan(210, 2),
}
#: seconds for all rows (``tools/bench_all.py`` kills a benchmark script after 1800 s): a job starts only
#: with at least MIN_JOB_S of it left, and gets what is left as its timeout
BUDGET_S = 1650.0
MIN_JOB_S = 120.0


# --------------------------------------------------------------------------- driver (root namespace)


def parse_list(text: str, allowed: Sequence[str], what: str) -> list[str]:
    """Comma-separated choices, in the given order; ``all`` for every one.

    Raises
    ------
    argparse.ArgumentTypeError
        On an empty list or an unknown entry.
    """
    items = list(allowed) if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if not items or bad:
        raise argparse.ArgumentTypeError(f"{what} must be 'all' or a comma-separated list of {list(allowed)}")
    return items


def driver(argv: Sequence[str]) -> int:
    """Run the chosen rows; print every job's BENCH lines. Returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--rates",
        type=lambda s: parse_list(s, list(RATES), "--rates"),
        default=list(RATES),
        help=f"comma-separated, of {','.join(RATES)} (default: all)",
    )
    p.add_argument(
        "--hosts",
        type=lambda s: [int(h) for h in parse_list(s, [str(h) for h in HOSTS], "--hosts")],
        help=f"comma-separated, of {','.join(map(str, HOSTS))} (default: all), one rank per host",
    )
    p.add_argument(
        "--workloads",
        type=lambda s: parse_list(s, WORKLOADS, "--workloads"),
        default=list(WORKLOADS),
        help=f"comma-separated, of {','.join(WORKLOADS)} (default: all)",
    )
    p.add_argument("--steps", type=int, help="steps per variant (default: per rate, see PLANS)")
    p.add_argument("--rounds", type=int, help="rounds per row (default: per rate, see PLANS)")
    p.add_argument("--budget", type=float, default=BUDGET_S, help=f"seconds for all rows (default {BUDGET_S:g})")
    p.add_argument(
        "--zipf-2x2",
        action="store_true",
        help="instead: bench_kvps.py --zipf-across-hosts on 2 hosts x 2 ranks, unshaped (the README's 2 x 2 rows)",
    )
    a = p.parse_args(argv)
    hosts = a.hosts or list(HOSTS)
    for name, v in (("--steps", a.steps), ("--rounds", a.rounds)):
        if v is not None and v < (3 if name == "--steps" else 1):
            p.error(f"{name} is too small: {v}")
    if not a.budget > 0:
        p.error(f"--budget must be positive, got {a.budget}")

    from distkit_common.testing import cluster, run_cluster

    reason = cluster.unavailable_reason()
    if reason:
        print(f"simulated cluster unavailable: {reason} (no measurement across hosts)", file=sys.stderr)
        return 0
    if a.zipf_2x2:
        res = run_cluster(2, 2, Path(__file__).with_name("bench_kvps.py"), 1500, args=["--zipf-across-hosts"])
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("BENCH ")]
        print("\n".join(lines), flush=True)
        return 0 if lines else 1
    failures = []
    start = time.monotonic()
    for rate in a.rates:
        plan = PLANS[rate]
        steps, rounds = a.steps or plan.steps, a.rounds or plan.rounds
        t0 = time.monotonic()
        with cluster.session(max(hosts), RATES[rate]):
            link_bound(rate)
            for n in hosts:
                left = a.budget - (time.monotonic() - start)
                if left < MIN_JOB_S:
                    failures.append(f"{rate}, {n} hosts: not run, {a.budget:g} s budget spent (--budget)")
                    continue
                args = ["--rank", "--rate", rate, "--workloads", ",".join(a.workloads)]
                args += ["--steps", str(steps), "--rounds", str(rounds)]
                try:
                    res = run_cluster(n, 1, Path(__file__).resolve(), left, args=args, check=False)
                except AssertionError as e:  # a timeout: every process of the job was killed
                    failures.append(f"{rate}, {n} hosts: {str(e).splitlines()[0]}")
                    continue
                print("\n".join(ln for ln in res.stdout.splitlines() if ln.startswith("BENCH ")), flush=True)
                if res.returncode != 0:
                    failures.append(f"{rate}, {n} hosts: exit {res.returncode}")
                    sys.stderr.write(res.stdout[-3000:] + res.stderr[-3000:])
        print(f"# {rate}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


def bench_line(name: str, value: float, **detail: float) -> str:
    """A BENCH line of the driver (the ranks print theirs with ``workloads.emit``)."""
    rec = {"package": "kvps", "name": name, "ratio": value, "goal": "info (the bound)", "met": None, "unit": "Mbit/s"}
    return "BENCH " + json.dumps(rec | ({"detail": detail} if detail else {}))


def link_bound(rate: str) -> None:
    """The link between dkh1 and dkh2 at ``rate``: one TCP stream for 2 s (``cluster.measure_tcp``) and
    ``MPI_Sendrecv`` of 4 MiB each way (``testing.measure_mpi_sendrecv``), printed as BENCH lines in Mbit/s."""
    from distkit_common.testing import cluster, measure_mpi_sendrecv

    tcp = cluster.measure_tcp(1, 2)
    print(bench_line(f"link at {rate}: one TCP stream dkh1 -> dkh2, payload", 8 * tcp / 1e6), flush=True)
    try:
        mpi = measure_mpi_sendrecv((1, 2), 4 << 20, 5)
    except AssertionError as e:  # the bound is information: a failed job costs the line, not the rows
        print(f"MPI_Sendrecv measurement failed: {str(e).splitlines()[0]}", file=sys.stderr)
        return
    print(
        bench_line(
            f"link at {rate}: MPI_Sendrecv of 4 MiB between dkh1 and dkh2, each way",
            8 * mpi["bytes_per_s"] / 1e6,
            median_s=mpi["median_s"],
            best_s=mpi["best_s"],
        ),
        flush=True,
    )


# --------------------------------------------------------------------------- ranks (one per host)


def workload(name: str, steps: int) -> tuple[str, int, Callable[[int], Sequence[Any]]]:
    """Description, key count and per-rank batches (``steps + AHEAD`` of them) of a workload."""
    import workloads as wl

    n = wl.size
    count = steps + AHEAD
    if name == "mf":
        rows, cols = 20_000, 2_000
        return (
            f"matrix factorisation: 20k own rows per rank, 1024 + 512 of 2k shared columns per step, d={wl.DIM}",
            wl.mf_keys(n, rows, cols),
            lambda r: wl.mf_batches(r, n, rows, cols, count, 1024, 512),
        )
    if name == "kge":
        return (
            f"knowledge-graph embeddings: 1024 triples per step, Zipf(1.1) over 200k entities + 300 relations, d={wl.DIM}",
            200_300,
            lambda r: wl.kge_batches(r, 200_000, 300, count, 1024),
        )
    if name == "w2v":
        return (
            f"word2vec-like: 1024 Zipf(1.1) words + 1024 uniform negatives per step, 200k vocabulary, d={wl.DIM}",
            400_000,
            lambda r: wl.w2v_batches(r, 200_000, count, 1024, 1024),
        )
    if name == "zipf":
        return (
            f"Zipf(1.1) 200k keys, batch 4096, each rank its own hot keys, d={wl.DIM}",
            200_000,
            lambda r: wl.zipf_batches(r, 200_000, count, 4096, True),
        )
    raise ValueError(f"unknown workload {name!r}")


def row(name: str, rate: str, steps: int, rounds: int) -> None:
    """One workload at one rate on this job's hosts: classic vs intent vs oracle, BENCH lines."""
    import numpy as np
    from workloads import (
        DIM,
        comm,
        emit,
        oracle_placement,
        rank,
        run_steps,
        size,
        uses_per_stay,
        wire_model,
        zipf_warm,
    )

    hosts = comm.allgather(socket.gethostname())
    assert len(set(hosts)) == size, f"needs one rank per host, got {hosts}"
    what, nk, batches_of = workload(name, steps)
    oracle = oracle_placement(batches_of, nk, hosts)
    mine = batches_of(rank)
    variants: dict[str, Callable[[], tuple[float, dict[str, float]]]] = {
        "classic": lambda: run_steps("none", nk, mine, steps, AHEAD),
        "intent": lambda: run_steps("all", nk, mine, steps, AHEAD),
        "oracle": lambda: run_steps("none", nk, mine, steps, AHEAD, relabel=oracle),
    }
    order = list(variants)
    t: dict[str, list[float]] = {v: [] for v in order}
    st: dict[str, dict[str, float]] = {}
    wire: dict[str, list[float]] = {v: [] for v in order}
    for k in range(rounds):
        for v in order[k % 3 :] + order[: k % 3]:  # the order rotates: drift favours no variant
            dt, st[v] = variants[v]()
            t[v].append(dt)
            wire[v].append(st[v]["wire_bytes_per_step"])
    measured = steps - zipf_warm(steps, AHEAD)
    ri = float(np.median([c / i for c, i in zip(t["classic"], t["intent"])]))
    ro = float(np.median([c / o for c, o in zip(t["classic"], t["oracle"])]))
    rio = float(np.median([o / i for o, i in zip(t["oracle"], t["intent"])]))
    where = f"{name}, {size} hosts x 1 rank, {rate}"
    goal = 0.95
    if rate == "100mbit" and name in ("mf", "kge"):
        goal = 2.0 if size == 2 else 3.0
    sps = {f"steps_per_s_{v}": measured / float(np.median(t[v])) for v in order}
    kb = {f"wire_kB_per_step_{v}": float(np.median(wire[v])) / 1e3 for v in order}
    si = st["intent"]
    accesses = max(1.0, si["local_timed"] + si["shared_timed"] + si["remote_timed"])
    emit(
        f"{where}: intent / classic speed ({what})",
        ri,
        f">= {goal:g}",
        ri >= goal,
        **sps,
        **kb,
        ratio_min=float(min(c / i for c, i in zip(t["classic"], t["intent"]))),
        ratio_max=float(max(c / i for c, i in zip(t["classic"], t["intent"]))),
        intent_moved=si.get("intent_moved"),
        intent_classic=si.get("intent_classic"),
        intent_all_keys=si.get("intent_all_keys"),
        intent_switches=si.get("intent_switches"),
        intent_probe_gain=si.get("intent_probe_gain"),
        intent_probe_cost=si.get("intent_probe_cost"),
        link_rate_MBps=si.get("link_rate", 0) / 1e6,
        link_weight=si.get("link_weight"),
        intent_local=si["local_timed"],
        intent_shared=si["shared_timed"],
        intent_remote=si["remote_timed"],
        intent_share_local=si["local_timed"] / accesses,
        intent_share_remote=si["remote_timed"] / accesses,
        intent_forwarded=si["forwarded_timed"],
        intent_given_back=si["given_back_timed"],
        intent_announced=si["announced_timed"],
        cpu_ms_per_step_intent=si["cpu_ms_per_step"],
        cpu_ms_per_step_classic=st["classic"]["cpu_ms_per_step"],
    )
    so = st["oracle"]
    emit(
        f"{where}: oracle placement (perfect foresight, free moves) / classic speed ({what})",
        ro,
        "info (the bound of intent's gain)",
        None,
        oracle_share_remote=so["remote_timed"] / max(1.0, so["local_timed"] + so["shared_timed"] + so["remote_timed"]),
        uses_per_stay=uses_per_stay(batches_of, nk, AHEAD) if rank == 0 else 0.0,
    )
    if rank == 0:  # (the model needs no ranks but this one: every rank can draw every rank's batches)
        classic_rows, paid_rows = wire_model(batches_of, nk, steps)
        free_rows = wire_model(batches_of, nk, steps, home=oracle[0] % size)[0]
        rp = classic_rows / max(1.0, paid_rows)
        link_bound = rate == "100mbit"
        emit(
            f"{where}: paid-move oracle (perfect foresight, every move sends the row once) / classic, "
            f"in rows crossing the link (model: the bound where the link binds) ({what})",
            rp,
            "info (the reachable bound where the link binds)",
            None,
            free_oracle_model=classic_rows / max(1.0, free_rows),
            wire_kB_per_step_model_classic=classic_rows * DIM * 4 / steps / 1e3 / size,
        )
        fp = (ri - 1) / (rp - 1) if rp > 1.05 else None
        emit(
            f"{where}: intent's share of the paid-move oracle's gain, (intent/classic - 1) / (paid/classic - 1) "
            f"({what})",
            fp,
            ">= 0.8" if fp is not None and link_bound else "info (the link does not bind, or no gain)",
            fp >= 0.8 if fp is not None and link_bound else None,
        )
    # the fraction of the oracle's gain intent reaches; meaningless where the oracle gains (almost) nothing
    frac = (ri - 1) / (ro - 1) if ro > 1.05 else None
    emit(
        f"{where}: intent's share of the oracle's gain, (intent/classic - 1) / (oracle/classic - 1) ({what})",
        frac,
        ">= 0.8" if frac is not None else "info (the oracle gains < 5 %)",
        frac >= 0.8 if frac is not None else None,
        intent_over_oracle=rio,
    )


def ranks(argv: Sequence[str]) -> int:
    """The rank side: every chosen workload's row."""
    p = argparse.ArgumentParser()
    p.add_argument("--rank", action="store_true")
    p.add_argument("--rate", required=True)
    p.add_argument("--workloads", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    a = p.parse_args(argv)
    for name in parse_list(a.workloads, WORKLOADS, "--workloads"):
        row(name, a.rate, a.steps, a.rounds)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(ranks(sys.argv[1:]) if "--rank" in sys.argv else driver(sys.argv[1:]))
