"""TorchShard-style tensor-parallel layers and sharded state dicts for PyTorch.

``import shardlayers as ts`` gives TorchShard's API: ``ts.slice``, ``ts.collect_state_dict``,
``ts.relocate_state_dict``, ``ts.register_ddp_parameters_to_ignore``, the parallel-dim tag helpers,
``ts.nn`` (parallel layers, loss, functional, init), ``ts.distributed`` (groups and autograd
communication ops) and ``ts.random`` (RNG tracker); plus ``ts.parallelize_module`` (tensor-parallelize
an existing model from a plan, ``ts.llama_plan``) and ``ts.sharded_state_dict`` /
``ts.load_sharded_state_dict`` (DTensor state dicts for DCP and distx-fake checkpoints).
"""

from __future__ import annotations

from . import _shardlayers, distributed, nn, random
from ._materialize import ShardMaterializeError
from ._plan import STYLES, llama_plan, parallelize_module
from ._sharded import load_sharded_state_dict, sharded_state_dict
from ._split import slice
from ._state_dict import collect_state_dict, register_ddp_parameters_to_ignore, relocate_state_dict
from ._tag import (
    _ORDER_ATTR,
    _ORDER_TYPE,
    _PARALLEL_ATTR,
    _PARALLEL_DIM,
    ParallelTensor,
    get_parallel_dim,
    register_parallel_attribute,
    register_parallel_dim,
    set_attribute,
)
from ._version import __version__

# F.cross_entropy on class-split logits computes the vocab-parallel loss: the tag module sits below
# the communication ops that loss is built on, so the loss is attached here, above both
ParallelTensor._vocab_parallel_loss = nn.functional.parallel_cross_entropy

__all__ = [
    "_ORDER_ATTR",
    "_ORDER_TYPE",
    "_PARALLEL_ATTR",
    "_PARALLEL_DIM",
    "STYLES",
    "ParallelTensor",
    "ShardMaterializeError",
    "__version__",
    "_shardlayers",
    "collect_state_dict",
    "distributed",
    "get_parallel_dim",
    "llama_plan",
    "load_sharded_state_dict",
    "nn",
    "parallelize_module",
    "random",
    "register_ddp_parameters_to_ignore",
    "register_parallel_attribute",
    "register_parallel_dim",
    "relocate_state_dict",
    "set_attribute",
    "sharded_state_dict",
    "slice",
]
