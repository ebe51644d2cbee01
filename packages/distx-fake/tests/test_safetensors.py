"""safetensors / Hugging Face: export of sharded checkpoints, loading into any sharding."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distkit_common.testing import run_spawn
from distx_fake import checkpoint as cp

safetensors_torch = pytest.importorskip("safetensors.torch")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "scripts"))
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


def _multi_rank_checkpoint(root: Path, parts: list[dict[str, object]], piece_bytes: int = 32 << 20) -> Path:
    """One checkpoint folder as ``len(parts)`` ranks would write it (rank r saves ``parts[r]``).

    Each part is saved alone, then the data files and the chunk lists of the sharded entries
    are merged; replicated entries keep rank 0's chunks (each tensor written once).
    """
    ck = root / "ck"
    ck.mkdir()
    merged: dict[str, object] = {}
    by: dict[tuple[str, ...], dict[str, object]] = {}
    for r, part in enumerate(parts):
        cp.save_state_dict({"model": part, "step": r}, cp.FileSystemWriter(root / f"r{r}", piece_bytes=piece_bytes))
        meta = json.loads((root / f"r{r}" / "metadata.json").read_text())
        (ck / f"rank{r}.bin").write_bytes((root / f"r{r}" / "rank0.bin").read_bytes())
        for e in meta["entries"]:
            for c in e.get("chunks", []):
                c["file"] = f"rank{r}.bin"
            if not r:
                by[tuple(e["path"])] = e
            elif isinstance(part.get(e["path"][-1]), cp.LocalShard):
                by[tuple(e["path"])]["chunks"] += e["chunks"]  # type: ignore[operator]
        if not r:
            merged = meta
    (ck / "metadata.json").write_text(json.dumps(merged))
    return ck


def test_export_consolidates_ranks_into_bounded_files_that_safetensors_loads(tmp_path: Path) -> None:
    sd = _sample()
    # as if written by 3 ranks: row blocks of the matrix, the rest replicated
    parts: list[dict[str, object]] = []
    for lo, hi in [(0, 100), (100, 170), (170, 300)]:
        part: dict[str, object] = {k: v for k, v in sd.items() if k != "emb.weight"}
        part["emb.weight"] = cp.LocalShard(sd["emb.weight"][lo:hi].clone(), (300, 70), (lo, 0))
        parts.append(part)
    ck = _multi_rank_checkpoint(tmp_path, parts)
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


def test_export_of_column_and_block_shards_split_into_many_pieces(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    mat = torch.randn(700, 300, generator=g)  # column blocks: one output run per row
    cube = torch.randn(6, 50, 40, generator=g).to(torch.bfloat16)  # 2 x 2 blocks over dims 1 and 2
    vec = torch.randn(5000, generator=g, dtype=torch.float64)
    # 4 ranks: column blocks of `mat` on ranks 0-2; `cube` in 2 x 2 blocks over dims 1 and 2 on
    # ranks 0-3; `vec` replicated (rank 0's copy is the one written)
    cols = [(0, 100), (100, 211), (211, 300)]
    blocks = [(0, 30, 0, 17), (0, 30, 17, 40), (30, 50, 0, 17), (30, 50, 17, 40)]
    parts: list[dict[str, object]] = []
    for r, (a0, a1, k0, k1) in enumerate(blocks):
        part: dict[str, object] = {"cube": cp.LocalShard(cube[:, a0:a1, k0:k1].clone(), (6, 50, 40), (0, a0, k0))}
        if r < len(cols):
            c0, c1 = cols[r]
            part["mat"] = cp.LocalShard(mat[:, c0:c1].clone(), (700, 300), (0, c0))
        if r == 0:
            part["vec"] = vec
        parts.append(part)
    # 8 KiB pieces: each chunk spans many pieces, and pieces end in the middle of output rows
    ck = _multi_rank_checkpoint(tmp_path, parts, piece_bytes=8192)
    meta = json.loads((ck / "metadata.json").read_text())
    mat_entry = next(e for e in meta["entries"] if e["path"] == ["model", "mat"])
    assert len(mat_entry["chunks"]) == 3 and all(len(c["pieces"]) > 10 for c in mat_entry["chunks"])
    out = tmp_path / "hf"
    index = cp.export_safetensors(ck, out, max_shard_size="300KB", prefix="model.", sync=False)
    got: dict[str, torch.Tensor] = {}
    for f in sorted(set(index["weight_map"].values())):
        got.update(safetensors_torch.load_file(str(out / f)))
    assert torch.equal(got["mat"], mat) and torch.equal(got["cube"], cube) and torch.equal(got["vec"], vec)

    # a flipped bit: the tensor is named, no output file gets a final name, no temporary is left
    data = bytearray((ck / "rank1.bin").read_bytes())
    piece = mat_entry["chunks"][1]["pieces"][3]
    data[piece[0] + 100] ^= 0x10
    (ck / "rank1.bin").write_bytes(bytes(data))
    with pytest.raises(cp.CheckpointCorruptionError, match="checksum mismatch in tensor 'mat'"):
        cp.export_safetensors(ck, tmp_path / "hf2", prefix="model.")
    assert os.listdir(tmp_path / "hf2") == []
    # a chunk missing: refused, not exported with a hole
    del mat_entry["chunks"][2]
    (ck / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(cp.CheckpointCorruptionError, match=r"'mat': its saved chunks hold 147700 of its 210000"):
        cp.export_safetensors(ck, tmp_path / "hf3", prefix="model.")


def test_export_over_an_export_keeps_other_files_and_removes_the_replaced_shards(tmp_path: Path) -> None:
    """The shards of an export never take a name the live index uses (so an export killed before
    its index is renamed into place leaves the previous one whole): standard names, then names
    with a token, then standard again; the replaced shards and unindexed ones go, other files stay."""
    sd = _sample()
    cp.save_state_dict(sd, cp.FileSystemWriter(tmp_path / "ck"), no_dist=True)
    out = tmp_path / "hf"
    out.mkdir()
    others = ["config.json", "adapter_model.safetensors", "model.safetensors.tmp-0123abcd"]
    for n in others:
        (out / n).write_text("{}")  # the user's files (and a temporary of the code before, whose writer is unknown)
    (out / "model-00007-of-00009.safetensors").write_text("stale")  # a shard no index names
    standard = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
    tokened = re.compile(r"model-[0-9a-f]{8}-\d{5}-of-\d{5}\.safetensors")
    for want in (standard, tokened, standard):
        index = cp.export_safetensors(tmp_path / "ck", out, max_shard_size="40KB")
        files = sorted(set(index["weight_map"].values()))
        assert len(files) >= 2 and all(want.fullmatch(f) for f in files), files
        assert sorted(os.listdir(out)) == sorted([*files, "model.safetensors.index.json", *others])
        got: dict[str, torch.Tensor] = {}
        for f in files:
            got.update(safetensors_torch.load_file(str(out / f)))
        assert got.keys() == sd.keys() and all(torch.equal(got[k], v) for k, v in sd.items())
    # a second export into the folder while one runs is refused (the lock dies with its holder)
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(RuntimeError, match="another export_safetensors is writing into"):
            cp.export_safetensors(tmp_path / "ck", out)
    finally:
        os.close(fd)
    assert sorted(os.listdir(out)) == sorted([*files, "model.safetensors.index.json", *others])


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
        timeout=300,
    )
    assert r.returncode == 1 and "no checkpoint" in r.stderr


@pytest.mark.spawn
def test_llama_deferred_trained_on_two_ranks_exported_then_from_pretrained_gives_same_logits(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import hf_workers
    from transformers import LlamaForCausalLM

    # the reverse direction's input: a save_pretrained folder, loaded by the same 2-rank job
    torch.manual_seed(5)
    pre = str(tmp_path / "pre")
    LlamaForCausalLM(hf_workers.config()).save_pretrained(pre, max_shard_size="30KB")
    assert len(set(json.loads(Path(pre, "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    ck, dst = str(tmp_path / "ck"), str(tmp_path / "hf")
    # 2 ranks: a deferred-init Llama trained with DDP, saved row-sharded; then the save_pretrained
    # folder loaded into DTensor rows, LocalShard column blocks and plain tensors (checked there)
    run_spawn(hf_workers.train_save_then_load_pretrained_body, 2, args=(ck, pre), timeout=300)
    # a fresh process: the export CLI, then from_pretrained gives the trained model's logits
    out = str(tmp_path / "logits")
    r = subprocess.run(
        [sys.executable, str(HERE / "scripts" / "hf_workers.py"), ck, dst, out],
        capture_output=True,
        text=True,
        timeout=300,
        env=OFFLINE,
    )
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout
    assert len(json.loads(Path(dst, "model.safetensors.index.json").read_text())["weight_map"]) > 10
    assert len(set(json.loads(Path(dst, "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    want, got = {"logits": torch.zeros(2, 8, 128)}, {"logits": torch.zeros(2, 8, 128)}
    cp.load_state_dict(want, cp.FileSystemReader(ck + "-logits"))
    cp.load_state_dict(got, cp.FileSystemReader(out))
    assert torch.equal(want["logits"], got["logits"])
