"""torch.distributed.checkpoint with distx-fake's storage: plans by DCP, bytes by distkit."""

from __future__ import annotations

import json
import pickle
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from distkit_common.testing import run_spawn
from distx_fake import checkpoint as cp

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "scripts"))
import dcp_workers  # noqa: E402


def _single(fn: object, *args: object, **kwargs: object) -> object:
    # DCP warns that it assumes a single process when no process group exists
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        return fn(*args, **kwargs)  # type: ignore[operator]


@pytest.mark.spawn
def test_model_and_adam_state_through_dcp_save_on_two_ranks_load_on_one_and_three(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "ck")
    # one 3-process job: ranks 0-1 save (2-rank mesh, dcp.save and dcp.async_save), then all 3
    # load (uneven shards) and compare with the full state rank 0 saved
    run_spawn(dcp_workers.save_on_two_load_on_three_body, 3, args=(path,), timeout=300)
    meta = json.loads((tmp_path / "ck" / "metadata.json").read_text())
    files = {c["file"] for e in meta["entries"] if e["kind"] == "tensor" for c in e["chunks"]}
    assert files == {"rank0.bin", "rank1.bin"}  # both ranks wrote their shards
    w = next(e for e in meta["entries"] if e["path"] == ["model", "0.weight"])
    assert len(w["chunks"]) == 2 and all(isinstance(p[2], int) for c in w["chunks"] for p in c["pieces"])
    assert meta["dcp"]["state_dict_metadata"]["model.0.weight"]["size"] == [16, 8]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "ck-async", "ck-ref"]  # nothing temporary left

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("unpickled while loading")

    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    _single(dcp_workers.load_and_check, path, None)  # one process, plain tensors


def test_dcp_reads_native_checkpoints_and_ours_reads_dcp_ones(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    sd = {"model": model.state_dict(), "meta": {"epoch": 2, "betas": (0.9, 0.99)}}
    cp.save_state_dict(sd, cp.FileSystemWriter(tmp_path / "native"))
    out = {
        "model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()},
        "meta": {"epoch": 0, "betas": None},
    }
    _single(dcp.load, out, storage_reader=cp.FileSystemReader(tmp_path / "native"))
    assert all(torch.equal(out["model"][k], v) for k, v in model.state_dict().items())
    assert out["meta"] == {"epoch": 2, "betas": (0.9, 0.99)}
    _single(dcp.save, sd, checkpoint_id=tmp_path / "viadcp", storage_writer=cp.FileSystemWriter(tmp_path / "x"))
    assert (tmp_path / "viadcp" / "metadata.json").exists() and not (tmp_path / "x").exists()
    back = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}, "meta": {"epoch": 0, "betas": 0}}
    cp.load_state_dict(back, cp.FileSystemReader(tmp_path / "viadcp"))
    assert all(torch.equal(back["model"][k], v) for k, v in model.state_dict().items())
    assert back["meta"] == {"epoch": 2, "betas": (0.9, 0.99)}
    # resharding inside one process: a row block of the saved weight
    block = {"model.weight": torch.zeros(2, 5)}
    md = cp.FileSystemReader(tmp_path / "viadcp").read_metadata()
    assert isinstance(md, dcp.Metadata) and md.state_dict_metadata["model.weight"].size == torch.Size([3, 5])
    del block


def test_dcp_checksum_and_bad_input(tmp_path: Path) -> None:
    sd = {"w": torch.arange(4096.0)}
    _single(dcp.save, sd, storage_writer=cp.FileSystemWriter(tmp_path / "ck"))
    meta = json.loads((tmp_path / "ck" / "metadata.json").read_text())
    off = meta["entries"][0]["chunks"][0]["pieces"][0][0] + 100
    f = tmp_path / "ck" / "rank0.bin"
    raw = bytearray(f.read_bytes())
    raw[off] ^= 0x10
    f.write_bytes(bytes(raw))
    # DCP reports a rank's error as a CheckpointException carrying it
    with pytest.raises(CheckpointException, match="CheckpointCorruptionError: checksum mismatch in tensor 'w'"):
        _single(dcp.load, {"w": torch.zeros(4096)}, storage_reader=cp.FileSystemReader(tmp_path / "ck"))
    with pytest.raises(CheckpointException, match="TypeError: state dict entry 'obj' has type object"):
        _single(dcp.save, {"obj": object(), "w": torch.ones(2)}, storage_writer=cp.FileSystemWriter(tmp_path / "bad"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # the failed save left nothing
    with pytest.raises(ValueError, match="use_collectives=False is not supported"):  # raised as is by DCP
        _single(dcp.save, sd, storage_writer=cp.FileSystemWriter(tmp_path / "nc"), use_collectives=False)
    # torch >= 2.13 passes the reader's error on; older DCP swallows it and fails on the missing metadata
    with pytest.raises((CheckpointException, AssertionError), match="no checkpoint|metadata is None"):
        _single(dcp.load, {"w": torch.zeros(1)}, storage_reader=cp.FileSystemReader(tmp_path / "none"))


@pytest.mark.parametrize("storage", ["torch", "distx"])
def test_non_tensor_values_and_missing_keys_behave_as_with_dcps_own_storage(tmp_path: Path, storage: str) -> None:
    # DCP's semantics, whoever stores the bytes: values that are not tensors are saved and replaced
    # in the caller's dict on load; a key asked for that the checkpoint lacks is DCP's own error
    # (what the README's example once did), unless the planner allows a partial load
    writer, reader = (
        (dcp.FileSystemWriter, dcp.FileSystemReader)
        if storage == "torch"
        else (cp.FileSystemWriter, cp.FileSystemReader)
    )
    _single(
        dcp.save,
        {"w": torch.ones(3), "step": 10, "meta": {"epoch": 2, "betas": [0.9, 0.99]}},
        storage_writer=writer(tmp_path / "a"),
    )
    sd = {"w": torch.zeros(3), "step": 0, "meta": {"epoch": 0, "betas": None}}
    _single(dcp.load, sd, storage_reader=reader(tmp_path / "a"))
    assert torch.equal(sd["w"], torch.ones(3)) and sd["step"] == 10 and sd["meta"] == {"epoch": 2, "betas": [0.9, 0.99]}
    _single(dcp.save, {"w": torch.ones(3)}, storage_writer=writer(tmp_path / "b"))
    sd = {"w": torch.zeros(3), "step": 0}
    with pytest.raises(CheckpointException, match="Missing key in checkpoint state_dict: step"):
        _single(dcp.load, sd, storage_reader=reader(tmp_path / "b"))
    assert sd["step"] == 0
    planner = DefaultLoadPlanner(allow_partial_load=True)
    _single(dcp.load, sd, storage_reader=reader(tmp_path / "b"), planner=planner)
    assert torch.equal(sd["w"], torch.ones(3)) and sd["step"] == 0
