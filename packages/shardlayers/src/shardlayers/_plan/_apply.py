"""``parallelize_module``: resolve and check the whole plan, then convert the modules."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from .._materialize import is_deferred_tensor
from ._convert import Options, check, convert, finish
from ._hooks import full_positions
from ._match import match_plan
from ._styles import Spec, resolve


def _tp_group(group: Any) -> tuple[Any, int, int]:
    """The tensor-parallel group to use: shardlayers' (initialised over the world when needed),
    which ``group`` (a ProcessGroup or 1-D DeviceMesh), when given, must be."""
    from ..distributed import _state

    if group is not None and hasattr(group, "get_group") and hasattr(group, "mesh"):  # a DeviceMesh
        if group.ndim != 1:
            raise ValueError(f"device_mesh must be 1-D (the tensor-parallel mesh), got {group.ndim}-D")
        group = group.get_group()
    if not dist.is_initialized():
        raise _state._no_group()
    if not _state.is_initialized():
        size = dist.get_world_size() if group is None else dist.get_world_size(group)
        _state.init_process_group(size)
    s = _state.state()
    if group is not None:
        ranks = dist.get_process_group_ranks(group)
        if sorted(ranks) != s.tp_ranks:
            raise ValueError(
                f"group (ranks {sorted(ranks)}) is not shardlayers' tensor-parallel group {s.tp_ranks}; call "
                "shardlayers.distributed.init_process_group(group_size) with the layout you want"
            )
    return s.tp_group, s.group_size, s.tp_ranks.index(dist.get_rank())


def parallelize_module(
    module: nn.Module,
    plan: Any = None,
    parallelize_plan: Any = None,
    *,
    group: Any = None,
    device_mesh: Any = None,
    uneven: bool = False,
    make_vocab_size_divisible_by: int | None = None,
) -> nn.Module:
    """Tensor-parallelize ``module`` in place following ``plan``.

    ``plan`` maps module names (relative to ``module``) or patterns (``"model.layers.*.mlp.up_proj"``:
    ``*`` matches inside one name component; a leading ``"*."`` any prefix, ``"*.mlp.down_proj"``)
    to styles:

    - ``"colwise"``: ``nn.Linear`` split along its outputs; the output stays split (Megatron
      ``gather_output=False``) and is returned as a plain local tensor. On ``nn.Embedding``: the
      embedding dim is split.
    - ``"rowwise"``: ``nn.Linear`` split along its inputs; the input is already split (the output
      of a ``"colwise"``), partial outputs are all-reduced, the bias added once.
    - ``"colwise_gather"``: as ``"colwise"``, output all-gathered (full).
    - ``"vocab"``: ``nn.Embedding`` split along the vocabulary.
    - ``"vocab_head"``: an LM head (``nn.Linear``) split along the vocabulary; its logits stay split
      and tagged, so ``ts.nn.ParallelCrossEntropyLoss`` -- and ``F.cross_entropy`` called on them,
      e.g. by the model's own loss -- computes the vocab-parallel loss without gathering them.
    - ``"sequence"``: a LayerNorm / RMSNorm-like module or ``nn.Dropout`` running on sequence
      chunks. A plan with ``"sequence"`` entries is sequence parallel: the residual stream is split
      along the sequence dim (1, ``[batch, seq, hidden]``); ``"vocab"`` and ``"rowwise"`` then
      reduce-scatter their outputs along it and the column styles all-gather their input (once per
      tensor, shared by sibling layers such as q/k/v).
    - ``"sequence_gather"``: any module whose first input is sequence-split and that needs the whole
      sequence (an attention block that reshapes by its input's shape): the input is all-gathered
      before it runs (DTensor's ``PrepareModuleInput(Shard(1) -> Replicate())``).

    Hugging Face ``tp_plan`` names (``"colwise_rep"``, ``"embedding_rowwise"``, ``"sequence_parallel"``,
    ...) and ``torch.distributed.tensor.parallel`` styles (``ColwiseParallel``, ``RowwiseParallel``,
    ``SequenceParallel``, ``PrepareModuleInput``, ``PrepareModuleOutput``, with their layouts) are
    accepted too, and so is DTensor's call ``parallelize_module(module, device_mesh, plan)``: a DTensor
    plan ports by changing the import.

    Weights are sliced from the module's parameters; a module built with
    ``distx_fake.deferred_init`` gets its shards materialized shard-only (the full weights are
    never allocated) and its remaining (replicated) tensors materialized whole. Every rank of the
    tensor-parallel group must call this with the same plan.

    Parameters
    ----------
    module : nn.Module
        The model; its converted submodules are replaced in place.
    plan : dict
        Module name or pattern -> style (or a DeviceMesh, DTensor's argument order).
    parallelize_plan : dict, optional
        The plan, when ``plan`` is a DeviceMesh.
    group : ProcessGroup or DeviceMesh, optional
        The tensor-parallel group; it must be shardlayers' (``ts.distributed.get_group()``). When
        shardlayers' groups are not initialised, they are made with this group's size (default:
        the world).
    device_mesh : DeviceMesh, optional
        DTensor's keyword for ``group``.
    uneven : bool
        Allow sizes that do not divide the group size (shards cut as ``torch.chunk``).
    make_vocab_size_divisible_by : int, optional
        Pad the vocabulary of ``"vocab"`` / ``"vocab_head"`` modules so every rank holds a multiple
        of this many rows (Megatron's option); padded logits are ``-inf`` and left out of the loss.

    Returns
    -------
    nn.Module
        ``module``.

    Raises
    ------
    TypeError
        A plan that is not a dict, a style value of the wrong type, or a style applied to a module
        it does not support.
    ValueError
        An unknown style or a pattern matching no module, a module matched by two entries, a split
        that does not divide (without ``uneven`` or padding), heads that cannot be split.
    RuntimeError
        Without ``torch.distributed``, or if a deferred parameter cannot be materialized by shard.
        All checks run before any module is changed.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    if parallelize_plan is not None:
        if plan is not None and not isinstance(plan, dict):  # DTensor's order: (module, device_mesh, plan)
            if group is not None or device_mesh is not None:
                raise ValueError("the tensor-parallel group is given twice")
            group = plan
        elif plan is not None:
            raise ValueError("pass the plan once (plan or parallelize_plan)")
        plan = parallelize_plan
    if device_mesh is not None:
        if group is not None:
            raise ValueError("pass either group or device_mesh, not both")
        group = device_mesh
    if not isinstance(plan, dict):
        raise TypeError(f"plan must be a dict of module name/pattern -> style, got {type(plan).__name__}")
    if make_vocab_size_divisible_by is not None and (
        isinstance(make_vocab_size_divisible_by, bool)
        or not isinstance(make_vocab_size_divisible_by, int)
        or make_vocab_size_divisible_by < 1
    ):
        raise ValueError(f"make_vocab_size_divisible_by must be an int >= 1, got {make_vocab_size_divisible_by!r}")

    # 1. resolve everything; nothing changes until every check passed
    specs = {key: resolve(value, key) for key, value in plan.items()}
    modules = dict(module.named_modules())
    names = [n for n in modules if n]
    hits = match_plan(list(plan), names)
    chosen: dict[str, tuple[str, Spec]] = {}
    for key, matched in hits.items():
        for name in matched:
            if name in chosen and chosen[name][1] != specs[key]:
                raise ValueError(f"module {name!r} is matched by plan keys {chosen[name][0]!r} and {key!r}")
            chosen[name] = (key, specs[key])
    seq_dims = {s.sequence_dim for _, s in chosen.values() if s.kind == "sequence" and s.from_string}
    if len(seq_dims) > 1:
        raise ValueError(f"sequence styles disagree on the sequence dim: {sorted(seq_dims)}")
    if seq_dims:
        (seq_dim,) = seq_dims
        chosen = {n: (k, s.with_sequence(seq_dim)) for n, (k, s) in chosen.items()}
    tp_group, size, rank = _tp_group(group)
    opt = Options(tp_group, size, rank, bool(uneven), make_vocab_size_divisible_by)
    for name, (_, spec) in chosen.items():
        parent = modules[name.rpartition(".")[0]] if "." in name else module
        check(name, modules[name], spec, parent, opt)

    # 2. convert, deepest first so parents see their converted children
    for name in sorted(chosen, key=lambda n: -n.count(".")):
        spec = chosen[name][1]
        old = modules[name]
        new = convert(old, spec, opt)
        if new is not old:
            parent_name, _, child = name.rpartition(".")
            setattr(modules[parent_name] if parent_name else module, child, new)
    if any(s.kind == "sequence" for _, s in chosen.values()):
        full_positions(module)
    _materialize_rest(module)
    modules = dict(module.named_modules())
    for name, (_, spec) in chosen.items():
        finish(modules[name], spec, opt)
    return module


def _materialize_rest(module: nn.Module) -> None:
    """A ``deferred_init`` model: its tensors that were not sharded are materialized whole."""
    if any(is_deferred_tensor(t) for t in (*module.parameters(), *module.buffers())):
        from distx_fake.deferred_init import materialize_module

        materialize_module(module)
