"""Plan values -> one internal description (:class:`Spec`): shardlayers' style names, the names
of Hugging Face ``tp_plan`` entries, and ``torch.distributed.tensor.parallel`` style objects."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

#: the style names of a plan (see ``parallelize_module``)
STYLES = ("colwise", "rowwise", "colwise_gather", "vocab", "vocab_head", "sequence", "sequence_gather")
#: Hugging Face ``tp_plan`` names with the same meaning
ALIASES = {
    "colwise_rep": "colwise_gather",
    "colwise_gather_output": "colwise_gather",
    "embedding_rowwise": "vocab",
    "embedding_colwise": "colwise",
    "sequence_parallel": "sequence",
}
#: default sequence dim of ``"sequence"`` (``[batch, seq, hidden]``, as DTensor and transformers)
SEQUENCE_DIM = 1


@dataclass(frozen=True)
class Spec:
    """What a plan entry asks of one module.

    kind: a name of :data:`STYLES`, or ``"prepare_input"`` / ``"prepare_output"``.
    (``"sequence_gather"``: the module's first input is sequence-split and is all-gathered.)
    input_seq_dim: column styles: the input is split along this (sequence) dim and is gathered.
    output_seq_dim: row styles and ``vocab``: reduce-scatter the output along this dim.
    input_is_parallel: ``rowwise``: the input is already split along its last dim.
    local_output: column styles: plain local output (no ``ParallelTensor`` tag).
    sequence_dim: ``sequence``: the dim the input is split along.
    arg_dims / kwarg_dims: ``prepare_*``: per positional argument (output) / keyword, the dim to
    gather (``("gather", d)``) or to split (``("split", d)``), or None.
    from_string: given as a style name (a sequence-parallel plan adapts those, see apply).
    """

    kind: str
    input_seq_dim: int | None = None
    output_seq_dim: int | None = None
    input_is_parallel: bool = True
    local_output: bool = True
    sequence_dim: int = SEQUENCE_DIM
    arg_dims: tuple[tuple[str, int] | None, ...] = ()
    kwarg_dims: tuple[tuple[str, tuple[str, int]], ...] = ()
    from_string: bool = False
    source: str = ""

    def with_sequence(self, dim: int) -> Spec:
        """The same string style inside a sequence-parallel plan whose stream is split along ``dim``."""
        if not self.from_string:
            return self
        if self.kind in ("colwise", "colwise_gather", "vocab_head"):
            return replace(self, input_seq_dim=dim)
        if self.kind in ("rowwise", "vocab"):
            return replace(self, output_seq_dim=dim)
        if self.kind == "sequence_gather":
            return replace(self, sequence_dim=dim)
        return self


def _placement(p: Any) -> tuple[str, int | None]:
    """('shard', dim) / ('replicate', None) of a DTensor placement (None counts as replicate)."""
    from torch.distributed.tensor import Replicate, Shard

    if p is None or isinstance(p, Replicate):
        return "replicate", None
    if isinstance(p, Shard):
        return "shard", int(p.dim)
    raise ValueError(f"placement {p!r} is not supported (only Shard(d) and Replicate())")


def _one(layouts: Any, what: str, key: str) -> tuple[str, int | None]:
    if layouts is None:
        return "replicate", None
    seq = tuple(layouts) if isinstance(layouts, (tuple, list)) else (layouts,)
    if len(seq) != 1:
        raise ValueError(f"plan[{key!r}]: {what} must hold one placement (a 1-D tensor-parallel mesh), got {seq!r}")
    return _placement(seq[0])


def _transition(src: Any, dst: Any, key: str) -> tuple[str, int] | None:
    a, ad = _placement(src)
    b, bd = _placement(dst)
    if (a, ad) == (b, bd) or dst is None or src is None:
        return None
    if a == "shard" and b == "replicate":
        assert ad is not None
        return ("gather", ad)
    if a == "replicate" and b == "shard":
        assert bd is not None
        return ("split", bd)
    raise ValueError(f"plan[{key!r}]: redistributing {src!r} -> {dst!r} is not supported")


def _from_dtensor(style: Any, key: str) -> Spec:
    from torch.distributed.tensor import parallel as tp

    name = type(style).__name__
    if isinstance(style, tp.ColwiseParallel):
        kin, din = _one(style.input_layouts, "input_layouts", key)
        kout, dout = _one(style.output_layouts, "output_layouts", key)
        if kout == "shard" and dout not in (-1,):
            raise ValueError(
                f"plan[{key!r}]: ColwiseParallel output_layouts must be Shard(-1) or Replicate(), got Shard({dout})"
            )
        # a split output kept as a (tagged) tensor is what loss_parallel heads use: "vocab_head"
        local = bool(style.use_local_output)
        kind = "colwise_gather" if kout == "replicate" else ("colwise" if local else "vocab_head")
        return Spec(kind, input_seq_dim=din if kin == "shard" else None, local_output=local, source=name)
    if isinstance(style, tp.RowwiseParallel):
        kin, din = _one(style.input_layouts, "input_layouts", key)
        kout, dout = _one(style.output_layouts, "output_layouts", key)
        if kin == "shard" and din != -1:
            raise ValueError(
                f"plan[{key!r}]: RowwiseParallel input_layouts must be Shard(-1) or Replicate(), got Shard({din})"
            )
        return Spec(
            "rowwise",
            input_is_parallel=kin == "shard",
            output_seq_dim=dout if kout == "shard" else None,
            source=name,
        )
    if isinstance(style, tp.SequenceParallel):
        (placement,) = style.sequence_sharding
        return Spec("sequence", sequence_dim=int(placement.dim), source=name)
    if isinstance(style, tp.PrepareModuleInput):
        args: list[tuple[str, int] | None] = []
        if style.input_layouts is not None:
            desired = style.desired_input_layouts or (None,) * len(style.input_layouts)
            args = [_transition(s, d, key) for s, d in zip(style.input_layouts, desired)]
        kw = []
        for k, src in (style.input_kwarg_layouts or {}).items():
            t = _transition(src, (style.desired_input_kwarg_layouts or {}).get(k), key)
            if t is not None:
                kw.append((k, t))
        return Spec("prepare_input", arg_dims=tuple(args), kwarg_dims=tuple(kw), source=name)
    if isinstance(style, tp.PrepareModuleOutput):
        desired = style.desired_output_layouts or (None,) * len(style.output_layouts)
        outs = tuple(_transition(s, d, key) for s, d in zip(style.output_layouts, desired))
        return Spec("prepare_output", arg_dims=outs, source=name)
    raise TypeError(
        f"plan[{key!r}]: {name} is not supported (ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput, PrepareModuleOutput are)"
    )


def resolve(value: Any, key: str) -> Spec:
    """The :class:`Spec` of one plan value.

    Raises
    ------
    ValueError
        An unknown style name or an unsupported layout.
    TypeError
        A value that is neither a style name nor a supported DTensor style object.
    """
    if isinstance(value, str):
        name = ALIASES.get(value, value)
        if name not in STYLES:
            raise ValueError(f"plan[{key!r}]: unknown style {value!r}; expected one of {STYLES}")
        return Spec(name, local_output=name != "vocab_head", from_string=True, source=repr(value))
    module = type(value).__module__
    if module.startswith("torch.distributed.tensor.parallel"):
        return _from_dtensor(value, key)
    raise TypeError(
        f"plan[{key!r}] must be a style name {STYLES} or a torch.distributed.tensor.parallel style, "
        f"got {type(value).__name__}"
    )
