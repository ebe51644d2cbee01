"""What every soak job's ranks share: the round clock, resident-memory samples and the
shared-memory segments the rank mapped (run under mpiexec by tools/soak.py)."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections import Counter
from typing import Any

#: the first third of the run is warm-up (caches, pools, hash maps reach their size); the
#: resident set at its end is the reference the end of the run is compared with
WARM_FRACTION = 1 / 3
#: seconds between rank 0's progress lines
PROGRESS_EVERY = 15.0


def rss_bytes() -> int:
    """This process's resident set (VmRSS of /proc/self/status), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def mapped_segments() -> set[str]:
    """The /dev/shm files this process maps now; those already unlinked end in " (deleted)"."""
    names = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)  # address perms offset dev inode [path]
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith("/dev/shm/"):
                names.add(path)
    return names


class Soak:
    """The rounds of one soak job on every rank: rank 0 decides when warm-up and the run end
    (one broadcast a round, so every rank takes the same collective steps), each rank samples
    its own resident set and records the segments it mapped; ``finish`` writes its figures."""

    def __init__(self, comm: Any, job: str, seconds: float, out: str) -> None:
        self.comm, self.job, self.seconds, self.out = comm, job, seconds, out
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.ops: Counter[str] = Counter()
        #: other counts a job keeps (written with the figures)
        self.extra: Counter[str] = Counter()
        self.rounds = 0
        self.segments: set[str] = set()
        self.rss_warm: int | None = None
        self.t0 = time.monotonic()
        self._last_line = self.t0

    def sample_segments(self) -> None:
        """Record the segments mapped now (for those made and freed within a round)."""
        self.segments |= mapped_segments()

    def next_round(self) -> bool:
        """End a round; False once the run's time is up (on every rank at the same round)."""
        self.rounds += 1
        self.segments |= mapped_segments()
        decision = None
        if self.rank == 0:
            now = time.monotonic()
            elapsed = now - self.t0
            decision = (elapsed < self.seconds, self.rss_warm is None and elapsed >= self.seconds * WARM_FRACTION)
            if now - self._last_line >= PROGRESS_EVERY:
                self._last_line = now
                print(
                    f"[{self.job}] {min(100, int(100 * elapsed / self.seconds))}% {elapsed:.0f}/{self.seconds:.0f} s, "
                    f"{self.rounds} rounds, {sum(self.ops.values())} ops on rank 0, "
                    f"rss {rss_bytes() / 2**20:.1f} MiB",
                    flush=True,
                )
        go, warm = self.comm.bcast(decision, root=0)
        if warm:
            gc.collect()
            self.rss_warm = rss_bytes()
        return bool(go)

    def finish(self, **extra: Any) -> None:
        """Write this rank's figures to <out>/<job>-rank<r>.json (read by tools/soak.py)."""
        gc.collect()
        self.segments |= mapped_segments()
        figures = {
            "job": self.job,
            "rank": self.rank,
            "size": self.size,
            "seconds": time.monotonic() - self.t0,
            "rounds": self.rounds,
            "ops": dict(self.ops),
            "rss_warm": self.rss_warm,
            "rss_end": rss_bytes(),
            "segments": sorted(self.segments),
            **self.extra,
            **extra,
        }
        with open(os.path.join(self.out, f"{self.job}-rank{self.rank}.json"), "w") as f:
            json.dump(figures, f)
        if self.rank == 0:
            print(f"[{self.job}] done: {self.rounds} rounds in {figures['seconds']:.0f} s", flush=True)
        sys.stdout.flush()
