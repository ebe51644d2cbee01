"""`nox -s demo`: distkit's main job, end to end, on 4 MPI ranks.

1. trains the recommender (tools/train_recsys.py) without interruption;
2. trains it again, stopped halfway (a simulated crash after a checkpoint), then
   resumed with ``--resume``;
3. checks that the resumed run ends in exactly the same state (bit for bit) and
   that the model beats the popularity baseline.

Options are passed through to the job (e.g. ``nox -s demo -- --steps 100``);
``-n N`` sets the rank count. Outputs go to results/demo/ (loss curve PNG,
summary.json).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from distkit_common.testing import run_mpi

HERE = Path(__file__).resolve().parent
JOB = HERE / "train_recsys.py"


def launch(nprocs: int, args: list[str]) -> None:
    res = run_mpi(JOB, nprocs, args=args, timeout=900, check=False)
    sys.stdout.write(res.stdout)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit(f"the training job failed (exit code {res.returncode})")
    for line in res.stderr.splitlines():  # the progress bar, kept to its last state
        if "train:" in line and "100%" in line:
            sys.stderr.write(line.split("\r")[-1] + "\n")


def main(argv: list[str]) -> int:
    nprocs = 4
    if argv[:1] == ["-n"] and len(argv) >= 2:
        nprocs, argv = int(argv[1]), argv[2:]
    out = HERE.parent / "results" / "demo"
    steps = 300
    if "--steps" in argv:
        steps = int(argv[argv.index("--steps") + 1])
    half = steps // 2 - 1
    t0 = time.monotonic()

    print(f"== 1/3: training {steps} steps on {nprocs} ranks", flush=True)
    shutil.rmtree(out / "full", ignore_errors=True)
    launch(nprocs, [*argv, "--out", str(out / "full")])
    print(f"== 2/3: the same job stopped after step {half + 1}, then resumed", flush=True)
    shutil.rmtree(out / "resumed", ignore_errors=True)
    launch(nprocs, [*argv, "--out", str(out / "resumed"), "--stop-after", str(half), "--quiet"])
    launch(nprocs, [*argv, "--out", str(out / "resumed"), "--resume", "--quiet"])

    full = json.loads((out / "full" / "summary.json").read_text())
    resumed = json.loads((out / "resumed" / "summary.json").read_text())
    print("== 3/3: checks", flush=True)
    same = full["digest"] == resumed["digest"]
    better = full["top10_accuracy"] > 1.5 * full["popularity_baseline"]
    print(f"resumed run bit-identical to the uninterrupted one: {same} ({full['digest'][0]} vs {resumed['digest'][0]})")
    print(
        f"top-10 accuracy {full['top10_accuracy']:.3f} vs popularity baseline {full['popularity_baseline']:.3f}: "
        f"{'clearly above' if better else 'NOT clearly above'}"
    )
    shutil.copy(out / "full" / "loss_curve.png", out / "loss_curve.png")
    shutil.copy(out / "full" / "summary.json", out / "summary.json")
    print(f"loss curve: {out / 'loss_curve.png'}; total {time.monotonic() - t0:.0f} s")
    return 0 if same and better else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
