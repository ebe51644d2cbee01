"""fake_mode construction of a 10B-parameter GPT vs torch's FakeTensorMode: time and RSS.

Each measurement runs in a fresh subprocess. RSS is the resident set after construction
minus the resident set right after a bare ``import torch`` in the same process (so imports
the fake machinery needs are counted). Time is the construction inside the mode; for torch's
FakeTensorMode the mode's own creation (which imports torch._dynamo) is *excluded*, which
favours the anchor.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import sys, time, json
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096
import torch
from torch import nn
base = rss()

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d); self.qkv = nn.Linear(d, 3 * d); self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d); self.fc = nn.Linear(d, 4 * d); self.out = nn.Linear(4 * d, d)

class GPT(nn.Module):
    def __init__(self, vocab=50257, d=5120, layers=32, ctx=2048):
        super().__init__()
        self.wte = nn.Embedding(vocab, d); self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d); self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

which = sys.argv[1]
if which == "distx":
    from distx_fake import fake
    t0 = time.perf_counter()
    with fake.fake_mode():
        m = GPT()
    dt = time.perf_counter() - t0
else:
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    t0 = time.perf_counter()
    with mode:
        m = GPT()
    dt = time.perf_counter() - t0
n = sum(p.numel() for p in m.parameters())
print(json.dumps({"time": dt, "rss": rss() - base, "params": n}))
"""


def run(which: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, which], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def bench(name: str, ratio: float, goal: str, met: bool, unit: str = "x", **extra: object) -> None:
    rec = {"package": "distx-fake", "name": name, "ratio": round(ratio, 3), "goal": goal, "met": met, "unit": unit}
    rec.update(extra)
    print("BENCH " + json.dumps(rec), flush=True)


def main() -> None:
    reps = int(os.environ.get("DISTX_BENCH_REPS", "5"))
    ours, anchor = [], []
    for _ in range(reps):  # alternating, so background load hits both alike
        ours.append(run("distx"))
        anchor.append(run("torch"))
    ratios = sorted(o["time"] / a["time"] for o, a in zip(ours, anchor))
    r = statistics.median(ratios)
    t_ours = statistics.median(o["time"] for o in ours)
    t_anchor = statistics.median(a["time"] for a in anchor)
    rss_ours = statistics.median(o["rss"] for o in ours) / 2**20
    rss_anchor = statistics.median(a["rss"] for a in anchor) / 2**20
    params = ours[0]["params"]
    print(
        f"# GPT {params / 1e9:.2f}B params: distx fake_mode {t_ours:.3f} s, +{rss_ours:.1f} MB over import torch; "
        f"torch FakeTensorMode {t_anchor:.3f} s, +{rss_anchor:.1f} MB (medians of {reps} alternating runs)"
    )
    bench(
        f"fake_mode construction of a 10B GPT: time distx / torch FakeTensorMode, median of {reps} paired runs",
        r,
        "<= 1.0",
        r <= 1.0,
        range=[round(ratios[0], 3), round(ratios[-1], 3)],
        seconds=round(t_ours, 3),
        anchor_seconds=round(t_anchor, 3),
    )
    bench(
        "fake_mode construction of a 10B GPT: RSS over bare import torch (MB)",
        rss_ours,
        "< 50",
        rss_ours < 50,
        unit="MB",
        anchor_mb=round(rss_anchor, 1),
    )


if __name__ == "__main__":
    main()
