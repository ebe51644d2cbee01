"""kvps under mpiexec: every behaviour grouped into a few launches per rank count."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import kvps
from distkit_common.testing import run_mpi

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("nprocs", "scenarios"),
    [
        (1, ["all:20000", "none:4000:shm"]),
        (2, ["all:100000:shm", "relocation_only:10000", "none:10000:shm"]),
        (3, ["all:20000", "replication_only:10000:shm", "none:6000"]),
        (4, ["all:100000", "relocation_only:10000:shm", "replication_only:8000"]),
    ],
)
def test_core_behaviours(nprocs: int, scenarios: list[str]) -> None:
    """100k concurrent key pushes sum exactly, monotone pulls, intent locality, replicas, bad input.

    ``:shm`` scenarios let co-located ranks serve each other's keys in shared
    memory (while keys relocate); the others send every foreign key as a message.
    """
    res = run_mpi(str(SCRIPTS / "core.py"), nprocs, args=tuple(scenarios), timeout=300)
    for spec in scenarios:
        tech, _, *flags = spec.split(":")
        assert f"core ok: technique={tech} ranks={nprocs} shm={flags == ['shm']}" in res.stdout


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("dtype", "save_ranks", "load_ranks"),
    [("float32", 3, 2), ("bfloat16", 1, 4)],
)
def test_checkpoint_into_other_rank_count(tmp_path: Path, dtype: str, save_ranks: int, load_ranks: int) -> None:
    ck = tmp_path / "ckpt"
    res = run_mpi(str(SCRIPTS / "persist.py"), save_ranks, args=("save", str(ck), dtype), timeout=300)
    assert "persist save ok" in res.stdout
    res = run_mpi(str(SCRIPTS / "persist.py"), load_ranks, args=("load", str(ck), dtype, str(save_ranks)), timeout=300)
    assert "persist load ok" in res.stdout
    # (float32 also checkpoints servers with Adam and row-wise Adagrad: their state, in ckpt-<rule>)
    rules = ["ckpt-adam", "ckpt-rowwise_adagrad"] if dtype == "float32" else []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", *rules]


@pytest.mark.mpi
def test_checkpoint_distx_format(tmp_path: Path) -> None:
    """server.save(path, format="distx"): distx-fake's checkpoint, loadable into another rank count."""
    pytest.importorskip("distx_fake")
    ck = tmp_path / "ckpt"
    res = run_mpi(str(SCRIPTS / "persist.py"), 3, args=("save", str(ck), "float32", "distx"), timeout=300)
    assert "persist save ok" in res.stdout
    res = run_mpi(str(SCRIPTS / "persist.py"), 2, args=("load", str(ck), "float32", "3", "distx"), timeout=300)
    assert "persist load ok" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "ckpt-adam", "ckpt-rowwise_adagrad"]


def test_save_format_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unknown formats and a missing distx-fake fail before anything is written or sent."""
    kvps.setup(4, 1, "none")
    server = kvps.Server(2)
    with pytest.raises(ValueError, match="format must be 'kvps' or 'distx'"):
        server.save(tmp_path / "x", format="pickle")
    with pytest.raises(ValueError, match="format must be"):
        server.load(tmp_path / "x", format="")
    monkeypatch.setitem(sys.modules, "distx_fake", None)  # as if not installed
    with pytest.raises(ImportError, match=r"kvps\[distx\]"):
        server.save(tmp_path / "x", format="distx")
    with pytest.raises(ImportError, match=r"kvps\[distx\]"):
        server.load(tmp_path / "x", format="distx")
    server.shutdown()
    assert list(tmp_path.iterdir()) == []


def test_setup_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="use_techniques"):
        kvps.setup(10, 1, "sometimes")
    with pytest.raises(ValueError, match="num_keys"):
        kvps.setup(0)
    with pytest.raises(TypeError, match="num_keys"):
        kvps.setup(10.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_threads"):
        kvps.setup(10, 0)
    with pytest.raises(ValueError, match="num_channels"):
        kvps.setup(10, 1, "all", 0)
    with pytest.raises(TypeError, match="num_channels"):
        kvps.setup(10, 1, "all", 1.5)  # type: ignore[arg-type]
    kvps.setup(10, 2, "", num_channels=4)  # AdaPM's defaults: "" = all techniques
    from kvps._setup import configured

    assert configured().technique == "all" and configured().num_threads == 2


def test_key_range_error_is_index_and_value_error() -> None:
    """AdaPM raises ValueError (std::length_error) for out-of-range keys; distkit uses IndexError."""
    assert issubclass(kvps.KeyRangeError, IndexError) and issubclass(kvps.KeyRangeError, ValueError)


@pytest.mark.mpi
@pytest.mark.parametrize(("nprocs", "shm"), [(1, "1"), (3, "1"), (3, "0")])
def test_adapm_ports(nprocs: int, shm: str) -> None:
    """AdaPM's example.py and tests/*.cc (set, dynamic allocation, locality, many keys, variable lengths, sampling).

    Run with co-located shards shared in memory (the default) and without (every foreign key a message).
    """
    res = run_mpi(str(SCRIPTS / "adapm_port.py"), nprocs, timeout=300, env={"KVPS_SHARED_MEMORY": shm})
    for part in ("example", "set/dynamic/locality/many", "varlen/sampling"):
        assert f"port ok: {part}" in res.stdout, res.stdout


def test_server_rejects_bad_value_lengths() -> None:
    kvps.setup(5, 1, "none")
    with pytest.raises(ValueError, match=">= 1"):
        kvps.Server(0)
    with pytest.raises(ValueError, match="shape"):
        kvps.Server(np.ones(4, dtype=np.int64))
    with pytest.raises(ValueError, match=r"value_lengths\[1\] = 2.5 is not a whole number"):
        kvps.Server(np.array([1, 2.5, 3, 4, 5], dtype=np.float32))
    with pytest.raises(TypeError, match="integer"):
        kvps.Server(np.ones(5, dtype=np.bool_))
    with pytest.raises(ValueError, match=r"value_lengths\[2\]"):
        kvps.Server(torch.tensor([1, 2, -1, 3, 4]))
    with pytest.raises(TypeError, match="dtype"):
        kvps.Server(3, dtype=torch.int32)
    with pytest.raises(TypeError):
        kvps.Server(True)
    with pytest.raises(ValueError, match="replica_sync_every"):
        kvps.Server(3, replica_sync_every=0)
    with pytest.raises(ValueError, match="intent_lookahead"):
        kvps.Server(3, intent_lookahead=-1)
    with pytest.raises(TypeError, match="shared_memory"):
        kvps.Server(3, shared_memory="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("rate", ["fast", "1", "-5gbit", "1e3gbit", "2tbit"])
def test_server_rejects_a_bad_link_rate(monkeypatch: pytest.MonkeyPatch, rate: str) -> None:
    kvps.setup(5, 1, "all")
    monkeypatch.setenv("KVPS_LINK_RATE", rate)
    with pytest.raises(ValueError, match="KVPS_LINK_RATE"):
        kvps.Server(3)


def test_link_rate_reads_tc_syntax(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvps._setup import link_rate

    monkeypatch.delenv("KVPS_LINK_RATE", raising=False)
    assert link_rate() == -1.0  # measured when the server starts
    for text, want in [("1gbit", 125e6), ("100mbit", 12.5e6), ("125MBps", 125e6), ("off", 0.0), ("0", 0.0)]:
        monkeypatch.setenv("KVPS_LINK_RATE", text)
        assert link_rate() == want, text
    monkeypatch.setenv("KVPS_LINK_RATE", "1gbit")
    kvps.setup(5, 1, "all")
    s = kvps.Server(3)  # one rank: nothing crosses hosts, the link is not weighed
    assert s.stats()["link_rate"] == 0 and s.stats()["link_weight"] == 0.0
    s.shutdown()


def test_worker_takes_adapm_keyword_names() -> None:
    """AdaPM's bindings.cc names: pull_sample(id, keys, vals, async), the async flag of pull/push/set/localize.

    ``async`` is a Python keyword: positionally or as ``**{"async": flag}``;
    the former pull_sample names still work, with a DeprecationWarning.
    """
    kvps.setup(30, 1, "none")
    s = kvps.Server(3)
    w = kvps.Worker(0, s)
    init = torch.arange(90, dtype=torch.float32)
    w.set(keys=torch.arange(30), vals=init)
    s.enable_sampling_support("naive", False, "uniform", 5, 25, seed=1)
    sid = w.prepare_sample(K=9, start=0, end=2)
    got: list[int] = []

    def check(keys: Any, vals: Any) -> None:
        k = torch.as_tensor(keys)
        assert torch.equal(torch.as_tensor(vals), init.view(30, 3)[k].reshape(-1)), (k, vals)
        got.extend(k.tolist())

    k, v = torch.zeros(2, dtype=torch.int64), torch.zeros(6)
    assert w.pull_sample(id=sid, keys=k, vals=v) == -1  # (one rank: answered locally)
    check(k, v)
    kn, vn = np.zeros(2, dtype=np.int64), np.zeros(6, dtype=np.float32)
    w.wait(w.pull_sample(sid, kn, vn, True))
    check(kn, vn)
    k, v = torch.zeros(1, dtype=torch.int64), torch.zeros(3)
    w.wait(w.pull_sample(sid, keys=k, vals=v, **{"async": True}))
    check(k, v)
    k, v = torch.zeros(1, dtype=torch.int64), torch.zeros(3)
    with pytest.raises(TypeError, match="asynchronous must be a bool"):
        w.pull_sample(sid, k, v, "yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got both 'keys_out' and 'keys'"):
        w.pull_sample(sid, keys=k, vals=v, keys_out=k)
    with pytest.raises(TypeError, match="id must be an int"):
        w.pull_sample(str(sid), k, v)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keys must be a 1-D int64"):
        w.pull_sample(sid, k.int(), v)
    with pytest.raises(ValueError, match="vals has 4 elements"):
        w.pull_sample(sid, k, torch.zeros(4))
    w.pull_sample(id=sid, keys=k, vals=v, asynchronous=False)  # (the refused calls took nothing)
    check(k, v)
    with pytest.warns(DeprecationWarning, match=r"Worker\.pull_sample\(sample_id=\.\.\.\) is deprecated, use id="):
        w.pull_sample(sample_id=sid, keys=k, vals=v)
    check(k, v)
    k, v = torch.zeros(2, dtype=torch.int64), torch.zeros(6)
    with pytest.warns(DeprecationWarning, match="is deprecated") as rec:
        w.pull_sample(sid, keys_out=k, vals_out=v)
    assert sorted(str(r.message).split("(")[1].split("=")[0] for r in rec) == ["keys_out", "vals_out"]
    check(k, v)
    assert len(got) == 9 == len(set(got)) and all(5 <= x < 25 for x in got)  # without replacement, in [min, max)
    with pytest.raises(KeyError, match="exhausted"):
        w.pull_sample(sid, torch.zeros(1, dtype=torch.int64), torch.zeros(3))
    # the async flag of the other operations, by AdaPM's keyword
    keys = torch.tensor([3, 7])
    w.wait(w.push(keys, torch.ones(6), **{"async": True}))
    w.wait(w.set(torch.tensor([9]), torch.full((3,), -1.0), **{"async": True}))
    w.wait(w.localize(keys, **{"async": True}))
    out = torch.zeros(9)
    w.wait(w.pull(torch.tensor([3, 7, 9]), out, **{"async": True}))
    assert torch.equal(out, torch.cat([init[9:12] + 1, init[21:24] + 1, torch.full((3,), -1.0)]))
    with pytest.raises(TypeError, match="got both 'async' and 'asynchronous'"):
        w.pull(keys, torch.zeros(6), asynchronous=True, **{"async": True})
    with pytest.raises(TypeError, match="asynchronous must be a bool"):
        w.localize(keys, **{"async": 1})
    s.shutdown()


@pytest.mark.mpi
def test_two_nodes_share_memory_within_a_node() -> None:
    """4 ranks as 2 nodes: in place within a node, relocated/replicated across, exact sums over all paths."""
    res = run_mpi(str(SCRIPTS / "nodes.py"), 4, timeout=300)
    assert "nodes ok: relocation_only" in res.stdout and "nodes ok: all" in res.stdout, res.stdout


@pytest.mark.mpi
def test_intent_cost_model() -> None:
    """One-off keys stay at their owners once the rank saw they do not recur; recurring keys move; sums exact."""
    res = run_mpi(str(SCRIPTS / "cost_model.py"), 2, timeout=300)
    assert "cost model ok" in res.stdout, res.stdout


@pytest.mark.mpi
def test_relocation_sticks() -> None:
    """A key one rank intends stays there after its window; two ranks intending it both hold it; it moves on
    to a later intender; sums exact under concurrent pushes (3 ranks, messages only)."""
    res = run_mpi(str(SCRIPTS / "sticky.py"), 3, timeout=300)
    assert "sticky ok" in res.stdout, res.stdout


@pytest.mark.mpi
def test_link_weight_moves_one_off_keys_where_the_link_binds() -> None:
    """The link is measured at start-up; where bytes bind, one-off keys keep moving and intent stays on."""
    res = run_mpi(str(SCRIPTS / "link_weight.py"), 2, timeout=300)
    assert "link weight ok" in res.stdout, res.stdout


@pytest.mark.mpi
def test_intent_ledger_pauses_and_resumes() -> None:
    """Intent pauses on both ranks where it cannot pay (moved keys stay), resumes where it pays; sums exact."""
    res = run_mpi(str(SCRIPTS / "ledger.py"), 2, timeout=300)
    assert "ledger ok" in res.stdout, res.stdout


@pytest.mark.mpi
def test_intent_pause_points_every_ranks_hints_at_the_keys() -> None:
    """At the pause kept keys are announced and given-back keys re-pointed home: a third rank's pulls go direct."""
    res = run_mpi(str(SCRIPTS / "ledger_hints.py"), 3, timeout=300)
    assert "ledger hints ok" in res.stdout, res.stdout


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("nprocs", "mode", "technique"),
    [
        (2, "msg", "all"),
        (3, "msg", "all"),
        (4, "msg", "relocation_only"),
        (3, "msg", "replication_only"),
        (4, "shm", "all"),
    ],
)
def test_keys_relocated_faster_than_they_travel(nprocs: int, mode: str, technique: str) -> None:
    """Keys moved back to a rank while their value is still on its way there and ordered on: no loop, sums exact."""
    res = run_mpi(str(SCRIPTS / "relocation_chaos.py"), nprocs, args=(mode, technique), timeout=300)
    assert f"relocation chaos ok: ranks={nprocs} shm={mode == 'shm'} technique={technique}" in res.stdout, res.stdout


@pytest.mark.mpi
def test_intent_rounds_with_a_long_lookahead() -> None:
    """lookahead 8: intents grouped in rounds every 2 clocks still arrive before use; late ones at once; sums exact."""
    res = run_mpi(str(SCRIPTS / "intent_rounds.py"), 2, timeout=300)
    assert "intent rounds ok" in res.stdout, res.stdout


@pytest.mark.mpi
def test_peer_exit_without_shutdown_fails_the_survivor() -> None:
    """A rank leaving without shutdown(): the peer's pending barrier and later pulls raise, no hang
    (the timeout only guards against the hang)."""
    res = run_mpi(str(SCRIPTS / "early_exit.py"), 2, timeout=300)
    assert "early exit ok" in res.stdout, res.stdout


@pytest.mark.mpi
def test_torch_embedding() -> None:
    """PSEmbedding: seeded init, closed-form Adagrad steps from two ranks, prefetch makes batches local."""
    res = run_mpi(str(SCRIPTS / "torch_embed.py"), 2, timeout=300)
    assert "torch ok on 2 ranks" in res.stdout


@pytest.mark.mpi
@pytest.mark.parametrize(("nprocs", "shm"), [(1, "1"), (2, "0"), (3, "1"), (4, "0")])
def test_embedding_bag_collection(nprocs: int, shm: str) -> None:
    """Bags on 1-4 ranks equal nn.EmbeddingBag + torch.optim rank by rank; intent for all tables; replicas converge."""
    res = run_mpi(str(SCRIPTS / "bags.py"), nprocs, timeout=300, env={"KVPS_SHARED_MEMORY": shm})
    assert f"bags ok on {nprocs} ranks" in res.stdout, res.stdout


@pytest.mark.mpi
def test_readme_example_runs() -> None:
    res = run_mpi(str(Path(__file__).parents[1] / "example.py"), 2, timeout=300)
    assert res.stdout.count("key 1 = [2. 2. 2. 2. 2. 2. 2. 2.]") == 2


@pytest.mark.mpi
def test_readme_recsys_example_trains() -> None:
    res = run_mpi(str(Path(__file__).parents[1] / "example_recsys.py"), 2, timeout=300)
    losses = re.findall(r"loss (\d+\.\d+) -> (\d+\.\d+)", res.stdout)
    assert len(losses) == 2 and all(float(b) < float(a) for a, b in losses), res.stdout
