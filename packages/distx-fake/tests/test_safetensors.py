"""safetensors / Hugging Face: export of sharded checkpoints, loading into any sharding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distkit_common.testing import run_spawn
from distx_fake import checkpoint as cp

safetensors_torch = pytest.importorskip("safetensors.torch")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "workers"))
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _sample() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "emb.weight": torch.randn(300, 70, generator=g),
        "half": torch.randn(33, generator=g).to(torch.float16),
        "bf": torch.randn(5, 7, generator=g).to(torch.bfloat16),
        "i8": torch.arange(-5, 5, dtype=torch.int8),
        "flags": torch.tensor([True, False, True]),
        "cube": torch.arange(4 * 5 * 6, dtype=torch.int64).reshape(4, 5, 6),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
    }


def test_export_consolidates_ranks_into_bounded_files_that_safetensors_loads(tmp_path: Path) -> None:
    sd = _sample()
    # as if written by 3 ranks: row blocks of the matrix, the rest replicated
    for r, (lo, hi) in enumerate([(0, 100), (100, 170), (170, 300)]):
        part = {k: v for k, v in sd.items() if k != "emb.weight"}
        part["emb.weight"] = cp.LocalShard(sd["emb.weight"][lo:hi].clone(), (300, 70), (lo, 0))  # type: ignore[assignment]
        cp.save_state_dict({"model": part, "step": r}, cp.FileSystemWriter(tmp_path / f"r{r}"))
    # merge the three single-rank checkpoints into one 3-rank checkpoint folder
    ck = tmp_path / "ck"
    ck.mkdir()
    merged = json.loads((tmp_path / "r0" / "metadata.json").read_text())
    by = {tuple(e["path"]): e for e in merged["entries"]}
    for r in range(3):
        meta = json.loads((tmp_path / f"r{r}" / "metadata.json").read_text())
        (ck / f"rank{r}.bin").write_bytes((tmp_path / f"r{r}" / "rank0.bin").read_bytes())
        e = next(e for e in meta["entries"] if e["path"] == ["model", "emb.weight"])
        for c in e["chunks"]:
            c["file"] = f"rank{r}.bin"
        if r:
            by[("model", "emb.weight")]["chunks"] += e["chunks"]
    (ck / "metadata.json").write_text(json.dumps(merged))
    out = tmp_path / "hf"
    index = cp.export_safetensors(ck, out, max_shard_size="40KB", prefix="model.")
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert sorted(os.listdir(out)) == [*files, "model.safetensors.index.json"]
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in sd.values())
    got: dict[str, torch.Tensor] = {}
    for f in files:
        size = (out / f).stat().st_size
        part = safetensors_torch.load_file(str(out / f))
        payload = sum(v.numel() * v.element_size() for v in part.values())
        assert payload <= 40_000 or len(part) == 1  # bounded, except one tensor larger than the bound
        assert size < payload + 4096
        got.update(part)
    assert got.keys() == sd.keys()
    for k, v in sd.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_load_safetensors_into_any_box_reads_only_its_bytes(tmp_path: Path) -> None:
    sd = _sample()
    safetensors_torch.save_file(sd, str(tmp_path / "one.safetensors"))
    dst = {
        "emb.weight": cp.LocalShard(torch.zeros(50, 20), (300, 70), (100, 25)),  # a block: one read per row
        "cube": cp.LocalShard(torch.zeros(2, 5, 3, dtype=torch.int64), (4, 5, 6), (1, 0, 3)),
        "half": torch.zeros(33, dtype=torch.float32),  # converted, as from_pretrained does
        "bf": torch.zeros(7, 5, dtype=torch.bfloat16).t(),  # non-contiguous destination
        "scalar": torch.zeros((), dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "absent": torch.zeros(1),
    }
    assert cp.load_safetensors(dst, tmp_path / "one.safetensors", strict=False) == ["absent"]
    assert torch.equal(dst["emb.weight"].tensor, sd["emb.weight"][100:150, 25:45])  # type: ignore[union-attr]
    assert torch.equal(dst["cube"].tensor, sd["cube"][1:3, :, 3:6])  # type: ignore[union-attr]
    assert torch.equal(dst["half"], sd["half"].float()) and torch.equal(dst["bf"], sd["bf"])  # type: ignore[arg-type]
    assert dst["scalar"] == 2.5
    with pytest.raises(KeyError, match="'absent' is not in the safetensors weights"):
        cp.load_safetensors({"absent": torch.zeros(1)}, tmp_path / "one.safetensors")
    with pytest.raises(ValueError, match=r"shape \(300, 70\) != state_dict shape \(70, 300\)"):
        cp.load_safetensors({"emb.weight": torch.zeros(70, 300)}, tmp_path / "one.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(ValueError, match="not a safetensors file"):
        cp.load_safetensors({}, bad)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        cp.load_safetensors({}, tmp_path / "nothing-here")
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        cp.load_safetensors([], tmp_path)  # type: ignore[arg-type]


def test_export_bad_input(tmp_path: Path) -> None:
    cp.save_state_dict(
        {"c": torch.ones(2, dtype=torch.complex128), "r": torch.ones(2)}, cp.FileSystemWriter(tmp_path / "ck")
    )
    with pytest.raises(ValueError, match="max_shard_size"):
        cp.export_safetensors(tmp_path / "ck", tmp_path / "o", max_shard_size="5 parsecs")
    with pytest.raises(ValueError, match="max_shard_size must be positive"):
        cp.export_safetensors(tmp_path / "ck", tmp_path / "o", max_shard_size=0)
    with pytest.raises(TypeError, match="complex128, which safetensors cannot hold"):
        cp.export_safetensors(tmp_path / "ck", tmp_path / "o")
    with pytest.raises(ValueError, match="no tensor .* starts with prefix 'zz'"):
        cp.export_safetensors(tmp_path / "ck", tmp_path / "o", prefix="zz")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        cp.export_safetensors(tmp_path / "none", tmp_path / "o")
    r = subprocess.run(
        [sys.executable, "-m", "distx_fake.checkpoint", "export", str(tmp_path / "none"), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "no checkpoint" in r.stderr


@pytest.mark.spawn
def test_llama_deferred_trained_on_two_ranks_exported_then_from_pretrained_gives_same_logits(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import hf_workers

    ck, dst = str(tmp_path / "ck"), str(tmp_path / "hf")
    run_spawn(hf_workers.train_save_body, 2, args=(ck,), timeout=300)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "distx_fake.checkpoint",
            "export",
            ck,
            dst,
            "--max-shard-size",
            "20KB",
            "--prefix",
            "model.",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert len(json.loads(Path(dst, "model.safetensors.index.json").read_text())["weight_map"]) > 10
    hf_workers.config().save_pretrained(dst)
    out = str(tmp_path / "logits")
    r = subprocess.run(
        [sys.executable, str(HERE / "workers" / "hf_workers.py"), dst, out],
        capture_output=True,
        text=True,
        timeout=300,
        env=OFFLINE,
    )
    assert r.returncode == 0, r.stderr
    want, got = {"logits": torch.zeros(2, 8, 128)}, {"logits": torch.zeros(2, 8, 128)}
    cp.load_state_dict(want, cp.FileSystemReader(ck + "-logits"))
    cp.load_state_dict(got, cp.FileSystemReader(out))
    assert torch.equal(want["logits"], got["logits"])

    # and the reverse: a save_pretrained folder into 2 ranks of another sharding
    from transformers import LlamaForCausalLM

    torch.manual_seed(5)
    LlamaForCausalLM(hf_workers.config()).save_pretrained(str(tmp_path / "pre"), max_shard_size="30KB")
    run_spawn(hf_workers.load_pretrained_body, 2, args=(str(tmp_path / "pre"),), timeout=300)
