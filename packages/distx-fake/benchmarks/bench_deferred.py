"""deferred_init + materialize_module of a ~286M-parameter GPT vs eager construction.

Each run is a fresh subprocess (both import torch, distx_fake and the model first; timing
starts after the imports). Time = eager ``GPT()`` vs ``deferred_init(GPT)`` +
``materialize_module``; peak RSS = ``ru_maxrss`` of the whole process. The model has GPT-2's
custom init (normal_ on Linear/Embedding over the default kaiming init, scaled residual
projections, tied head, a causal-mask buffer). The bench also checks bit-identity.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import sys, time, json, resource, hashlib
sys.path.insert(0, sys.argv[2])
import torch
from _models import GPT
from distx_fake import deferred_init as di
torch.manual_seed(0)
t0 = time.perf_counter()
if sys.argv[1] == "eager":
    m = GPT()
    t_rec = 0.0
else:
    m = di.deferred_init(GPT)
    t_rec = time.perf_counter() - t0
    di.materialize_module(m)
dt = time.perf_counter() - t0
after = torch.rand(4).tolist()
h = hashlib.sha256()
for k, v in sorted(m.state_dict().items()):
    h.update(k.encode()); h.update(v.contiguous().view(torch.uint8).numpy().tobytes()[:: 997])
print(json.dumps({"time": dt, "record": t_rec, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "params": sum(p.numel() for p in m.parameters()), "digest": h.hexdigest(), "after": after}))
"""


def run(which: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", CHILD, which, HERE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def bench(name: str, ratio: float, goal: str, met: bool, **extra: object) -> None:
    rec = {"package": "distx-fake", "name": name, "ratio": round(ratio, 3), "goal": goal, "met": met, "unit": "x"}
    rec.update(extra)
    print("BENCH " + json.dumps(rec), flush=True)


def main() -> None:
    reps = int(os.environ.get("DISTX_BENCH_REPS", "5"))
    eager, deferred = [], []
    for _ in range(reps):  # interleaved so background load hits both alike
        eager.append(run("eager"))
        deferred.append(run("deferred"))
    same = all(d["digest"] == eager[0]["digest"] and d["after"] == eager[0]["after"] for d in deferred)
    med = statistics.median
    t_ratios = sorted(float(d["time"]) / float(e["time"]) for e, d in zip(eager, deferred))  # type: ignore[arg-type]
    m_ratios = sorted(int(d["maxrss"]) / int(e["maxrss"]) for e, d in zip(eager, deferred))  # type: ignore[call-overload]
    te = med(float(r["time"]) for r in eager)  # type: ignore[arg-type]
    td = med(float(r["time"]) for r in deferred)  # type: ignore[arg-type]
    tr = med(float(r["record"]) for r in deferred)  # type: ignore[arg-type]
    re_ = med(int(r["maxrss"]) for r in eager)  # type: ignore[call-overload]
    rd = med(int(r["maxrss"]) for r in deferred)  # type: ignore[call-overload]
    n = int(eager[0]["params"])  # type: ignore[call-overload]
    print(
        f"# GPT {n / 1e6:.0f}M params (medians of {reps} alternating runs): eager {te:.2f} s, deferred_init "
        f"{tr:.2f} s + materialize = {td:.2f} s; peak RSS eager {re_ / 2**20:.0f} MB, deferred {rd / 2**20:.0f} MB; "
        f"bit-identical + same RNG stream: {same}"
    )
    r = med(t_ratios)
    bench(
        f"deferred_init+materialize {n / 1e6:.0f}M GPT: time / eager, median of {reps} paired runs",
        r,
        "<= 1.3",
        r <= 1.3 and same,
        range=[round(t_ratios[0], 3), round(t_ratios[-1], 3)],
        bit_identical=same,
        seconds=round(td, 3),
        eager_seconds=round(te, 3),
        record_seconds=round(tr, 3),
    )
    r = med(m_ratios)
    bench(
        f"deferred_init+materialize {n / 1e6:.0f}M GPT: peak RSS / eager, median of {reps} paired runs",
        r,
        "<= 1.1",
        r <= 1.1,
        mb=round(rd / 2**20),
        eager_mb=round(re_ / 2**20),
    )


if __name__ == "__main__":
    main()
