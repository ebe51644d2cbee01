"""distkit's main job: a next-item recommender trained on N MPI ranks with all five packages.

    mpiexec -n 4 python -m mpi4py tools/train_recsys.py [--steps 300] [--resume] ...

(``nox -s demo`` runs it for you.) Synthetic click logs with learnable structure:
user ``u`` clicks item ``i`` with probability ``softmax_i(2 z_u . w_i + pop_i)``,
where ``z``, ``w`` are hidden factors and the item features are a noisy linear
image of ``w``. The model predicts the next clicked item from the user's
embedding and the features of the item clicked before:

- the model is built with ``distx_fake.deferred_init`` and materialized on each rank;
- user embeddings (a sparse table) live in ``kvps``; intent is signalled a few
  batches ahead so the rows are local when used;
- the item-feature table is one ``wholemem`` HOST tensor shared by all ranks of the node;
- the output layer over all items is column-sharded with ``shardlayers``
  (``ParallelLinear`` + ``ParallelCrossEntropyLoss``), tensor-parallel groups of
  ``--tp`` ranks times data-parallel groups;
- dense parameters are averaged inside autograd with ``mpiad``'s ``Allreduce``
  (replicated layers over all ranks, the head's shards over the data-parallel group);
- a sharded checkpoint is written with ``distx_fake.checkpoint`` every
  ``--ckpt-every`` steps (the kvps table with ``Server.save``); ``--resume``
  continues from it, bit-identically to an uninterrupted run.

Rank 0 shows a progress bar, prints the loss and top-10 accuracy against the
popularity baseline, and saves the loss curve as a PNG.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch import nn

import kvps
import mpiad
import shardlayers as ts
import wholemem as wg
from distkit_common.collective import allgather_json, bcast_json
from distx_fake import checkpoint, deferred_init

#: mpi4py's world: rendezvous and splits. Three kinds of communicator meet in this job:
#: mpi4py's ``MPI.Comm``, mpiad's differentiable ``mpiad.MPI_Communicator`` (``world``,
#: ``dp_comm``) and wholemem's ``wg.WholeMemoryCommunicator`` (``wm_comm``, one per node).
WORLD = MPI.COMM_WORLD


# --------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class Config:
    steps: int
    batch: int
    users: int
    items: int
    factors: int
    features: int
    dim: int
    hidden: int
    tp: int
    lr: float
    emb_lr: float
    lookahead: int
    ckpt_every: int
    eval_every: int
    eval_size: int
    seed: int


def parse_args(argv: list[str]) -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--batch", type=int, default=256, help="samples per data-parallel group per step")
    p.add_argument("--users", type=int, default=20_000)
    p.add_argument("--items", type=int, default=4096, help="size of the output class space")
    p.add_argument("--factors", type=int, default=8, help="rank of the hidden user/item structure")
    p.add_argument("--features", type=int, default=16, help="item feature width (wholemem table)")
    p.add_argument("--dim", type=int, default=32, help="user embedding width (kvps table)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel group size (must divide the rank count)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--emb-lr", type=float, default=2.0)
    p.add_argument("--lookahead", type=int, default=2, help="batches of intent signalled ahead")
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-size", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("results/demo"), help="folder for checkpoints, curve, summary")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--stop-after", type=int, default=None, help="stop after this step (simulates an interruption)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    size = WORLD.size
    problems = []
    for name in (
        "steps",
        "batch",
        "users",
        "items",
        "factors",
        "features",
        "dim",
        "hidden",
        "tp",
        "ckpt_every",
        "eval_every",
        "eval_size",
    ):
        if getattr(a, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.lookahead < 0:
        problems.append(f"--lookahead must be >= 0, got {a.lookahead}")
    if a.tp >= 1 and size % a.tp:
        problems.append(f"--tp {a.tp} does not divide the {size} ranks of this job")
    if a.tp >= 1 and a.items % a.tp:
        problems.append(f"--items {a.items} is not divisible by --tp {a.tp}")
    dp = size // a.tp if a.tp >= 1 and size % a.tp == 0 else 1
    if a.users < dp:
        problems.append(f"--users {a.users} is smaller than the {dp} data-parallel groups")
    if a.lr <= 0 or a.emb_lr <= 0:
        problems.append("--lr and --emb-lr must be positive")
    if a.stop_after is not None and not 0 <= a.stop_after < a.steps:
        problems.append(f"--stop-after must lie in [0, {a.steps}), got {a.stop_after}")
    if a.resume and not (a.out / "ckpt" / "latest.json").exists():
        problems.append(f"--resume: no checkpoint in {a.out / 'ckpt'}")
    if problems:
        if WORLD.rank == 0:
            p.print_usage(sys.stderr)
            for msg in problems:
                print(f"{p.prog}: error: {msg}", file=sys.stderr)
        sys.exit(2)
    cfg = Config(
        a.steps,
        a.batch,
        a.users,
        a.items,
        a.factors,
        a.features,
        a.dim,
        a.hidden,
        a.tp,
        a.lr,
        a.emb_lr,
        a.lookahead,
        a.ckpt_every,
        a.eval_every,
        a.eval_size,
        a.seed,
    )
    return cfg, a


# --------------------------------------------------------------------------- synthetic click logs
class ClickLogs:
    """Deterministic synthetic data: every rank can draw any batch of any step."""

    def __init__(self, cfg: Config) -> None:
        g = torch.Generator().manual_seed(cfg.seed)
        self.cfg = cfg
        self.z = torch.randn(cfg.users, cfg.factors, generator=g)
        self.w = torch.randn(cfg.items, cfg.factors, generator=g) / cfg.factors**0.5
        self.pop = torch.randn(cfg.items, generator=g)
        proj = torch.randn(cfg.factors, cfg.features, generator=g)
        self.features = self.w @ proj + 0.1 * torch.randn(cfg.items, cfg.features, generator=g)

    def _draw(self, users: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        logits = 2.0 * self.z[users] @ self.w.T * self.cfg.factors**0.5 + self.pop
        probs = torch.softmax(logits, dim=1)
        two = torch.multinomial(probs, 2, replacement=True, generator=g)
        return two[:, 0], two[:, 1]  # context item, next item

    def batch(self, step: int, dp_rank: int, dp_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Users of this data-parallel group (u % dp_size == dp_rank), their context and target items."""
        g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step * 1009 + dp_rank)
        n_own = (self.cfg.users - dp_rank + dp_size - 1) // dp_size
        users = torch.randint(0, n_own, (self.cfg.batch,), generator=g) * dp_size + dp_rank
        ctx, target = self._draw(users, g)
        return users, ctx, target

    def users_of(self, step: int, dp_rank: int, dp_size: int) -> torch.Tensor:
        return self.batch(step, dp_rank, dp_size)[0].unique()

    def eval_set(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.cfg.seed + 10_000_019)
        users = torch.randint(0, self.cfg.users, (self.cfg.eval_size,), generator=g)
        ctx, target = self._draw(users, g)
        return users, ctx, target

    def popularity_baseline(self, k: int = 10) -> float:
        """Top-k accuracy of always recommending the k items most clicked overall."""
        _, _, target = self.eval_set()
        g = torch.Generator().manual_seed(self.cfg.seed + 7)
        train_users = torch.randint(0, self.cfg.users, (20_000,), generator=g)
        _, clicks = self._draw(train_users, g)
        top = torch.bincount(clicks, minlength=self.cfg.items).topk(k).indices
        return torch.isin(target, top).float().mean().item()


# --------------------------------------------------------------------------- model
class RecModel(nn.Module):
    """User embedding + context-item features -> MLP -> column-parallel head over all items."""

    def __init__(self, dim: int, features: int, hidden: int, items: int) -> None:
        super().__init__()
        self.ctx = nn.Linear(features, dim)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = ts.nn.ParallelLinear(hidden, items, bias=True, dim=-1)

    def forward(self, user_vec: torch.Tensor, ctx_features: torch.Tensor) -> torch.Tensor:
        h = self.mlp(torch.cat([user_vec, self.ctx(ctx_features)], dim=1))
        return self.head(h)  # local logits [batch, items / tp], tagged split on the last dim


def averaged_params(
    model: nn.Module, world: mpiad.MPI_Communicator, dp_comm: mpiad.MPI_Communicator
) -> dict[str, torch.Tensor]:
    """Every parameter replaced by its average over its replicas, computed inside autograd:
    the backward of Allreduce(SUM) sums the gradients, so each rank's copy gets the mean gradient."""
    out = {}
    for name, p in model.named_parameters():
        comm = dp_comm if ts.get_parallel_dim(p) is not None else world
        out[name] = comm.Allreduce(p, mpiad.MPI_SUM) / comm.size
    return out


# --------------------------------------------------------------------------- the job
def node_communicator() -> wg.WholeMemoryCommunicator:
    """The wholemem communicator of the ranks on this node (a HOST tensor lives in one node's memory).

    The node's first rank starts the rendezvous; its id travels as JSON (never pickled).
    Every member runs on this machine, so the id names the loopback address: the
    advertised default (``MASTER_ADDR``, the job's first host) is another node's.
    """
    node = WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=WORLD.rank)
    uid = dataclasses.asdict(wg.get_unique_id()) if node.rank == 0 else None
    uid = wg.UniqueId(**{**bcast_json(uid, node), "host": "127.0.0.1"})
    wm_comm = wg.create_communicator(node.size, uid, node.rank)
    node.Free()
    return wm_comm


def digest(model: nn.Module, table: torch.Tensor) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    h.update(table.numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str]) -> int:
    cfg, args = parse_args(argv)
    rank, size = WORLD.rank, WORLD.size
    out: Path = args.out
    ckpt_dir = out / "ckpt"
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    WORLD.Barrier()
    t_start = time.perf_counter()

    # torch.distributed (gloo) for shardlayers, rendezvous through a file next to the outputs
    store_path = out / f".store-{os.getpid() if rank == 0 else 0}"
    store_path = Path(bcast_json(str(store_path), WORLD))
    dist.init_process_group("gloo", store=dist.FileStore(str(store_path), size), rank=rank, world_size=size)
    ts.distributed.init_process_group(group_size=cfg.tp)
    tp_rank, dp_size = ts.distributed.get_rank(), size // cfg.tp
    dp_rank = rank // cfg.tp
    world = mpiad.COMM_WORLD
    dp_comm = mpiad.comm_from_mpi4py(WORLD.Split(color=tp_rank, key=rank))

    data = ClickLogs(cfg)

    # wholemem: the item-feature table, one shared-memory copy per node
    wg.init_lib()
    wm_comm = node_communicator()
    feats = wg.create_wm_tensor(wm_comm, [cfg.items, cfg.features], [], torch.float32, wg.WmTensorType.HOST)
    if wm_comm.rank == 0:
        feats.copy_(data.features)
    wm_comm.barrier()

    # kvps: the user embedding table
    kvps.setup(cfg.users, 1)
    server = kvps.Server(cfg.dim)
    worker = kvps.Worker(0, server)

    # distx_fake: build the model without allocating, then materialize (same seed on every rank)
    torch.manual_seed(cfg.seed)
    model = deferred_init.deferred_init(RecModel, cfg.dim, cfg.features, cfg.hidden, cfg.items)
    deferred_init.materialize_module(model)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    loss_fn = ts.nn.ParallelCrossEntropyLoss()

    start, history = 0, []
    if args.resume:
        meta = json.loads((ckpt_dir / "latest.json").read_text())
        state = ts.collect_state_dict(model, model.state_dict())
        checkpoint.load_state_dict(state, checkpoint.FileSystemReader(str(ckpt_dir / meta["dir"] / "model")))
        model.load_state_dict(ts.relocate_state_dict(model, state))
        server.load(str(ckpt_dir / meta["dir"] / "kvps"))
        start, history = meta["step"] + 1, meta["history"]
    else:
        worker.begin_setup()
        if rank == 0:
            g = torch.Generator().manual_seed(cfg.seed + 1)
            init = (0.1 * torch.randn(cfg.users, cfg.dim, generator=g)).reshape(-1)
            worker.set(torch.arange(cfg.users), init)
        worker.end_setup()
    server.barrier()

    pusher = tp_rank == 0  # one rank per data-parallel group owns its users' updates: deterministic sums
    for s in range(start, min(start + cfg.lookahead, cfg.steps)):
        if pusher:
            worker.intent(data.users_of(s, dp_rank, dp_size), s, s + 1)

    bar = None
    if rank == 0 and not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    eval_users, eval_ctx, eval_target = data.eval_set()
    baseline = data.popularity_baseline()
    stop = cfg.steps - 1 if args.stop_after is None else args.stop_after
    step = start - 1
    # wall time after every step that neither evaluates nor saves: the training speed in summary.json
    train_s: list[float] = []
    train_cpu: list[float] = []  # this process's CPU seconds in those steps (all its threads)
    for step in range(start, stop + 1):
        t_step, c_step = time.perf_counter(), time.process_time()
        while worker.current_clock() < step:
            worker.advance_clock()
        ahead = step + cfg.lookahead
        if pusher and ahead < cfg.steps:
            worker.intent(data.users_of(ahead, dp_rank, dp_size), ahead, ahead + 1)

        users, ctx, target = data.batch(step, dp_rank, dp_size)
        uniq, inverse = users.unique(return_inverse=True)
        rows = torch.empty(len(uniq) * cfg.dim)
        worker.pull(uniq, rows)
        rows = rows.view(len(uniq), cfg.dim).requires_grad_(True)
        ctx_feat = wg.gather(feats, ctx)

        params = averaged_params(model, world, dp_comm)
        logits = torch.func.functional_call(model, params, (rows[inverse], ctx_feat))
        ts.register_parallel_dim(logits, -1)
        loss = loss_fn(logits, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if pusher:
            grad = rows.grad
            assert grad is not None
            worker.push(uniq, (-cfg.emb_lr * grad).reshape(-1))
        worker.waitall()
        mean_loss = world.Allreduce(loss.detach().reshape(1), mpiad.MPI_SUM).item() / size
        history.append([step, mean_loss])
        busy = (step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1
        if not (busy or (step + 1) % cfg.ckpt_every == 0 or step == stop):
            train_s.append(time.perf_counter() - t_step)
            train_cpu.append(time.process_time() - c_step)

        if busy:
            acc = evaluate(model, worker, feats, cfg, eval_users, eval_ctx, eval_target, world)
            history[-1].append(acc)
            if rank == 0:
                msg = f"step {step + 1}: loss {mean_loss:.4f}, top-10 accuracy {acc:.3f} (popularity baseline {baseline:.3f})"
                (bar.write(msg) if bar else print(msg, flush=True))
        if (step + 1) % cfg.ckpt_every == 0 or step == stop:
            save(model, server, ckpt_dir, step, history, rank)
        if bar:
            bar.update(1)
            bar.set_postfix(loss=f"{mean_loss:.3f}")
    if bar:
        bar.close()

    finished = step == cfg.steps - 1
    table = torch.empty(cfg.users * cfg.dim)
    worker.pull(torch.arange(cfg.users), table)
    fingerprint = digest(model, table)
    server.barrier()
    worker.finalize()
    server.shutdown()
    # (blocking MPI collectives of the application only once the server is gone: save())
    fingerprints = allgather_json(fingerprint, WORLD)
    if rank == 0:
        acc = history[-1][2] if len(history[-1]) > 2 else float("nan")
        summary = {
            "config": asdict(cfg),
            "finished": finished,
            "last_step": step + 1,
            "loss": history[-1][1],
            "top10_accuracy": acc,
            "popularity_baseline": baseline,
            "digest": fingerprints,
            "seconds": time.perf_counter() - t_start,
            "ranks": size,
            # rank 0's plain training steps after the first 10 (warm-up): median and mean rate
            "steps_timed": len(train_s[10:]),
            "steps_per_s": len(train_s[10:]) / sum(train_s[10:]) if train_s[10:] else None,
            "step_s_median": statistics.median(train_s[10:]) if train_s[10:] else None,
            "cpu_s_per_step": sum(train_cpu[10:]) / len(train_cpu[10:]) if train_cpu[10:] else None,
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        if finished:
            plot(history, baseline, out / "loss_curve.png")
        print(
            f"{'finished' if finished else 'stopped'} at step {step + 1} in {summary['seconds']:.0f} s; "
            f"state digest per rank {fingerprints}",
            flush=True,
        )
    wm_comm.destroy()
    wg.finalize_lib()
    dist.destroy_process_group()
    if rank == 0:
        store_path.unlink(missing_ok=True)
    return 0


def evaluate(
    model: nn.Module,
    worker: Any,
    feats: torch.Tensor,
    cfg: Config,
    users: torch.Tensor,
    ctx: torch.Tensor,
    target: torch.Tensor,
    world: mpiad.MPI_Communicator,
) -> float:
    """Top-10 accuracy on the held-out clicks (the local logit shards are gathered over the TP group)."""
    with torch.no_grad():
        uniq, inverse = users.unique(return_inverse=True)
        rows = torch.empty(len(uniq) * cfg.dim)
        worker.pull(uniq, rows)
        logits = model(rows.view(len(uniq), cfg.dim)[inverse], wg.gather(feats, ctx))
        full = ts.distributed.gather(logits, dim=-1) if cfg.tp > 1 else logits
        top = full.topk(10, dim=1).indices
        return (top == target[:, None]).any(dim=1).float().mean().item()


def save(model: nn.Module, server: Any, ckpt_dir: Path, step: int, history: list, rank: int) -> None:
    """Full (collected) model state through distx_fake's checkpoint, the kvps table through Server.save,
    into ckpt/step-N; latest.json is switched to it atomically only after both are complete."""
    target = ckpt_dir / f"step-{step + 1}"
    state = ts.collect_state_dict(model, model.state_dict())
    checkpoint.save_state_dict(state, checkpoint.FileSystemWriter(str(target / "model")))
    server.save(str(target / "kvps"))
    # kvps's barrier, not MPI_Barrier: a blocking MPI collective of the application while
    # the server's progress thread talks to another host can hang (kvps README, Limitations)
    server.barrier()
    if rank == 0:
        tmp = ckpt_dir / "latest.json.tmp"
        tmp.write_text(json.dumps({"step": step, "dir": target.name, "history": history}))
        os.replace(tmp, ckpt_dir / "latest.json")
        for old in ckpt_dir.glob("step-*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
    server.barrier()


def plot(history: list, baseline: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h[0] + 1 for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].plot(steps, [h[1] for h in history], lw=1)
    ax[0].set(xlabel="step", ylabel="cross-entropy", title="training loss")
    ev = [(h[0] + 1, h[2]) for h in history if len(h) > 2]
    ax[1].plot([e[0] for e in ev], [e[1] for e in ev], marker="o", label="model")
    ax[1].axhline(baseline, color="gray", ls="--", label="popularity baseline")
    ax[1].set(xlabel="step", ylabel="top-10 accuracy", title="held-out clicks")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
