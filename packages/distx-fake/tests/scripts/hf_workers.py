"""Bodies of the Hugging Face tests: a small Llama from transformers, built with deferred_init.

No hub access: models come from a config written here.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel
from transformers import LlamaConfig, LlamaForCausalLM

from distkit_common.testing import destroy_process_group, init_process_group
from distx_fake import checkpoint as cp
from distx_fake import deferred_init as di

IDS = torch.tensor([[1, 5, 9, 33, 2, 70, 11, 4], [8, 8, 1, 0, 3, 120, 7, 6]])


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )


def rows(n: int, size: int, rank: int) -> tuple[int, int]:
    return n * rank // size, n * (rank + 1) // size


def train_save_then_load_pretrained_body(rank: int, size: int, store: str, path: str, pretrained: str) -> None:
    """Both directions in one job (process starts dominate these tests' cost)."""
    init_process_group(rank, size, store)
    train_save(rank, size, path)
    load_pretrained(rank, size, pretrained)
    destroy_process_group()  # frees train_save's DDP first


def train_save(rank: int, size: int, path: str) -> None:
    """Train a deferred-init Llama a few steps with DDP, save it sharded by rows (as FSDP keeps it)."""
    torch.manual_seed(0)
    model = di.deferred_init(LlamaForCausalLM, config())
    di.materialize_module(model)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + rank)  # every rank its own batches
    for _ in range(3):
        ids = torch.randint(0, 128, (2, 12), generator=g)
        loss = ddp(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    shards: dict[str, Any] = {}
    for k, v in model.state_dict().items():
        if v.dim() >= 2:
            lo, hi = rows(v.shape[0], size, rank)
            shards[k] = cp.LocalShard(v[lo:hi].clone(), tuple(v.shape), (lo,) + (0,) * (v.dim() - 1))
        else:
            shards[k] = v
    cp.save_state_dict({"model": shards, "step": 3}, cp.FileSystemWriter(path))
    if rank == 0:
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=IDS).logits
        cp.save_state_dict({"logits": logits}, cp.FileSystemWriter(path + "-logits"), no_dist=True)
    dist.barrier()


def export_then_logits_of_pretrained(ck: str, folder: str, out: str) -> None:
    """In a fresh process: the export CLI (``python -m distx_fake.checkpoint export``, run in this
    process), then ``from_pretrained(folder)`` and its logits on IDS."""
    import runpy

    from transformers import AutoModelForCausalLM

    sys.argv = ["distx_fake.checkpoint", "export", ck, folder, "--max-shard-size", "20KB", "--prefix", "model."]
    try:
        runpy.run_module("distx_fake.checkpoint", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code:
            raise
    config().save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=IDS).logits
    cp.save_state_dict({"logits": logits}, cp.FileSystemWriter(out), no_dist=True)


def load_pretrained(rank: int, size: int, folder: str) -> None:
    """A save_pretrained folder into 2 ranks: DTensor row shards, LocalShard column blocks, plain."""
    from safetensors.torch import load_file

    mesh = init_device_mesh("cpu", (size,))
    full: dict[str, torch.Tensor] = {}
    import json
    import os

    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        for fn in sorted(set(json.load(f)["weight_map"].values())):
            full.update(load_file(os.path.join(folder, fn)))  # the reference reader
    sd: dict[str, Any] = {}
    for k, v in full.items():
        if "mlp" in k:  # a column block on each rank
            lo, hi = rows(v.shape[1], size, rank)
            sd[k] = cp.LocalShard(torch.zeros(v.shape[0], hi - lo, dtype=v.dtype), tuple(v.shape), (0, lo))
        elif v.dim() == 2:
            sd[k] = distribute_tensor(torch.zeros_like(v), mesh, [Shard(0)])
        else:
            sd[k] = torch.zeros_like(v)
    missing = cp.load_safetensors(sd, folder)
    assert missing == []
    for k, v in full.items():
        got = sd[k]
        if isinstance(got, cp.LocalShard):
            lo, hi = rows(v.shape[1], size, rank)
            assert torch.equal(got.tensor, v[:, lo:hi]), k
        elif hasattr(got, "full_tensor"):
            assert torch.equal(got.full_tensor(), v), k
        else:
            assert torch.equal(got, v), k


if __name__ == "__main__":
    export_then_logits_of_pretrained(sys.argv[1], sys.argv[2], sys.argv[3])
