"""distx-fake in one script (one process): `python distx_fake_quickstart.py`.

A fake 4 TiB tensor, a module built without allocating it and materialized bit-identical to eager
construction, and a checkpoint saved, loaded, exported to a Hugging Face folder and read back
into a shard.
"""

import tempfile
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from distx_fake import checkpoint, deferred_init, fake

with fake.fake_mode():
    big = torch.empty(1 << 40)  # 4 TiB, nothing allocated
    y = big[:8] * 2
print(y)  # tensor(..., size=(8,), fake=True)
assert fake.is_fake(y)

torch.manual_seed(0)
eager = nn.TransformerEncoderLayer(64, 4)
torch.manual_seed(0)
m = deferred_init.deferred_init(nn.TransformerEncoderLayer, 64, 4)
deferred_init.materialize_module(m)
assert all(torch.equal(a, b) for a, b in zip(eager.state_dict().values(), m.state_dict().values(), strict=True))

tmp = Path(tempfile.mkdtemp(prefix="distx-example-"))
checkpoint.save_state_dict({"model": m.state_dict(), "step": 10}, checkpoint.FileSystemWriter(tmp / "ck"))
sd = {"model": {k: torch.zeros_like(v) for k, v in m.state_dict().items()}, "step": 0}
checkpoint.load_state_dict(sd, checkpoint.FileSystemReader(tmp / "ck"))
assert sd["step"] == 10 and torch.equal(sd["model"]["linear1.weight"], m.linear1.weight)
fut = checkpoint.async_save_state_dict(sd, checkpoint.FileSystemWriter(tmp / "ck2"))
fut.result()

# DCP's planner and Stateful objects, distkit's bytes (JSON metadata, crc32c, atomic commit); as
# with DCP's own storage, values that are not tensors are saved and replaced on load, and every
# key of the dict given to dcp.load must be in the checkpoint
dcp.save({"model": m.state_dict(), "step": 10}, storage_writer=checkpoint.FileSystemWriter(tmp / "ck3"))
sd["step"] = 0
dcp.load(sd, storage_reader=checkpoint.FileSystemReader(tmp / "ck3"))
assert sd["step"] == 10

# a Hugging Face folder, and back into any sharding (here: rows 0..31 of a weight)
checkpoint.export_safetensors(tmp / "ck3", tmp / "hf", max_shard_size="5GB", prefix="model.")
part = {"linear1.weight": checkpoint.LocalShard(torch.zeros(32, 64), (2048, 64), (0, 0))}
checkpoint.load_safetensors(part, tmp / "hf")  # export dropped the "model." prefix
assert torch.equal(part["linear1.weight"].tensor, m.linear1.weight[:32])
print("checkpoints in", tmp)
