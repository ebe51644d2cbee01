"""ParallelEmbedding: vocab-parallel (dim=0) or embedding-dim-parallel (dim=-1)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._ddp import check_ddp, register_if_world
from .._split import padded_size, partition_range
from .._tag import _FULL_SIZE, _PARALLEL_DIM, check_dim, register_parallel_attribute
from . import functional as PF
from ._linear import _check_features, _convert, _load_slices, _tp, track_parameters
from .init import init_shard_


class ParallelEmbedding(nn.Module):
    """Embedding table split over the tensor-parallel group.

    The weight uses ``nn.Embedding``'s layout ``[num_embeddings, embedding_dim]`` (order type 1).

    - ``dim=None``: plain ``nn.Embedding``.
    - ``dim=0`` (vocab parallel): weight ``[V_local, D]``; the full output is formed by an all-reduce.
    - ``dim=-1`` or ``1``: weight ``[V, D_local]``; as in TorchShard the local lookups are
      all-gathered into the full output ``[*, D]`` (``gather_output=False`` keeps it split along
      the last dim, tagged -1, e.g. to feed a row-parallel layer).

    Parameters
    ----------
    num_embeddings, embedding_dim : int
        Full sizes.
    padding_idx : int, optional
        Global index of the padding row (zero and never updated).
    max_norm : float, optional
        As in ``nn.Embedding`` (not with ``dim=-1``).
    norm_type : float, default 2.0
        As in ``nn.Embedding``.
    scale_grad_by_freq : bool, default False
        As in ``nn.Embedding``.
    sparse : bool, default False
        As in ``nn.Embedding``.
    _weight : torch.Tensor, optional
        The full table ``[num_embeddings, embedding_dim]`` to start from (this rank keeps its
        slice), as in ``nn.Embedding`` / TorchShard.
    dim : {None, 0, 1, -1}
        Parallel dim.
    gather_output : bool
        For ``dim=-1``: return the full (all-gathered) output (default) or the local split.
    uneven : bool
        Allow a split size that does not divide the group size (shards cut as ``torch.chunk``).
    pad_to_multiple_of : int, optional
        ``dim=0`` only: every rank stores a multiple of this many rows, real rows first
        (Megatron's ``make_vocab_size_divisible_by``); padding rows are zero and never looked up.
    sequence_parallel : bool
        ``dim=0`` only: reduce-scatter the output along ``sequence_dim`` instead of all-reducing it
        (the first layer of a sequence-parallel region).
    sequence_dim : int
        Sequence dimension of the output.
    device : torch.device, optional
        Placement of the weight (``meta``: not initialised).
    dtype : torch.dtype, optional
        The weight's dtype.

    Raises
    ------
    ValueError
        Invalid ``dim``, sizes, ``padding_idx``, a size that does not divide, or padding /
        sequence parallelism with ``dim != 0``.
    RuntimeError
        If ``dim`` is not None and the process groups are not initialised.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: torch.Tensor | None = None,
        dim: int | None = None,
        *,
        gather_output: bool = True,
        uneven: bool = False,
        pad_to_multiple_of: int | None = None,
        sequence_parallel: bool = False,
        sequence_dim: int = 0,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.num_embeddings = _check_features("num_embeddings", num_embeddings)
        self.embedding_dim = _check_features("embedding_dim", embedding_dim)
        self.dim = check_dim(dim)
        if pad_to_multiple_of is not None:
            _check_features("pad_to_multiple_of", pad_to_multiple_of)
        if (pad_to_multiple_of is not None or sequence_parallel) and dim != 0:
            raise ValueError(f"pad_to_multiple_of and sequence_parallel need dim=0, got dim={dim!r}")
        self.pad_to_multiple_of = pad_to_multiple_of
        self.sequence_parallel = bool(sequence_parallel)
        self.sequence_dim = int(sequence_dim)
        track_parameters(self)
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"padding_idx {padding_idx} out of range for {num_embeddings} embeddings")
            padding_idx = padding_idx % num_embeddings
        if max_norm is not None and dim in (1, -1):
            raise ValueError("max_norm is not supported with dim=-1 (each rank holds part of every row)")
        self.padding_idx = padding_idx
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        self.gather_output = bool(gather_output)
        if _weight is not None:
            if not isinstance(_weight, torch.Tensor):
                raise TypeError(f"_weight must be a tensor, got {type(_weight).__name__}")
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(
                    f"_weight has shape {tuple(_weight.shape)}, expected {(num_embeddings, embedding_dim)}"
                )
        v_l, d_l = num_embeddings, embedding_dim
        if dim is not None:
            p, r = _tp()
            if dim == 0 and pad_to_multiple_of is not None:
                v_l = padded_size(num_embeddings, p, pad_to_multiple_of)
            elif dim == 0:
                v_l = partition_range(num_embeddings, p, r, uneven=uneven, what="num_embeddings")[1]
            else:
                d_l = partition_range(embedding_dim, p, r, uneven=uneven, what="embedding_dim")[1]
        self.weight = nn.Parameter(torch.empty((v_l, d_l), device=device, dtype=dtype))
        self._register_tags()
        if _weight is None:
            self.reset_parameters()
        else:
            from .._state_dict import relocate_state_dict

            sd = relocate_state_dict(self, {"weight": _weight.detach().to(self.weight.dtype)})
            with torch.no_grad():
                self.weight.copy_(sd["weight"])

    def _register_tags(self) -> None:
        """(Re-)attach the parallel attributes to the weight (also after it was replaced)."""
        weight = self._parameters.get("weight")
        if weight is None:
            return
        register_parallel_attribute(weight, self.dim, 1)
        if self.dim == 0:
            setattr(weight, _FULL_SIZE, self.num_embeddings)
        elif self.dim is not None:
            setattr(weight, _FULL_SIZE, self.embedding_dim)

    def reset_parameters(self) -> None:
        """Initialise as ``nn.Embedding`` initialises the full table (normal, padding row zero), then slice."""

        def init(full: torch.Tensor) -> None:
            nn.init.normal_(full)
            if self.padding_idx is not None:
                full[self.padding_idx].fill_(0)

        init_shard_(init, self.weight)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Look up ``input`` (see the class docstring).

        Parameters
        ----------
        input : torch.Tensor
            Global indices ``[*]`` into the full table.

        Returns
        -------
        torch.Tensor
            Embeddings ``[*, embedding_dim]`` (split along the last dim, tagged -1, for ``dim=-1``
            with ``gather_output=False``; split along ``sequence_dim`` with ``sequence_parallel``).
        """
        if _PARALLEL_DIM not in self.weight.__dict__:
            self._register_tags()
        check_ddp(self)
        return PF.parallel_embedding(
            input,
            self.weight,
            self.padding_idx,
            self.max_norm,
            self.norm_type,
            self.scale_grad_by_freq,
            self.sparse,
            num_embeddings=self.num_embeddings,
            dim=self.dim,
            gather_output=self.gather_output,
            sequence_dim=self.sequence_dim if self.sequence_parallel else None,
        )

    def extra_repr(self) -> str:
        """Return the table's arguments for its ``repr``.

        Returns
        -------
        str
            Sizes, the arguments that differ from their defaults, and the parallel dim.
        """
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        if self.sparse:
            s += ", sparse=True"
        if self.dim is not None:
            s += f", dim={self.dim}"
        return s

    @classmethod
    def convert_parallel_embedding(
        cls, module: nn.Module, dim: int | None = None, *, uneven: bool = False
    ) -> nn.Module:
        """Replace every ``nn.Embedding`` in ``module`` (:func:`convert_parallel_embedding`).

        Parameters
        ----------
        module : nn.Module
            The module, itself an ``nn.Embedding`` or holding nested ones.
        dim : {None, 0, 1, -1}
            The parallel dim of the new layers (None: replicated).
        uneven : bool, default False
            Allow sizes the group size does not divide (``torch.chunk``'s split).

        Returns
        -------
        nn.Module
            The converted module (``module`` itself, modified, unless it is an ``nn.Embedding``).
        """
        return convert_parallel_embedding(module, dim, uneven=uneven)


def convert_parallel_embedding(module: nn.Module, dim: int | None = None, *, uneven: bool = False) -> nn.Module:
    """Replace every ``nn.Embedding`` in ``module`` by a :class:`ParallelEmbedding` holding its slice.

    Every ``nn.Embedding`` (nested too) becomes a table holding the matching slice of the original
    one (split tables listed for DDP to ignore when the tensor-parallel group is the whole world,
    see :func:`convert_parallel_linear`).

    Parameters
    ----------
    module : nn.Module
        The module, itself an ``nn.Embedding`` or holding nested ones.
    dim : {None, 0, 1, -1}
        The parallel dim of the new layers (None: replicated).
    uneven : bool, default False
        Allow sizes the group size does not divide (``torch.chunk``'s split).

    Returns
    -------
    nn.Module
        The converted module.

    Raises
    ------
    TypeError
        If ``module`` is not an ``nn.Module``.
    ValueError
        If ``dim`` is invalid or a size does not divide.
    RuntimeError
        If ``dim`` is not None and the process groups are not initialised.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    check_dim(dim)

    def make(m: nn.Module) -> nn.Module | None:
        if type(m) is not nn.Embedding:
            return None
        new = ParallelEmbedding(
            m.num_embeddings,
            m.embedding_dim,
            m.padding_idx,
            m.max_norm,
            m.norm_type,
            m.scale_grad_by_freq,
            m.sparse,
            dim=dim,
            uneven=uneven,
            device=m.weight.device,
            dtype=m.weight.dtype,
        )
        _load_slices(new, m)
        return new

    return register_if_world(_convert(module, make))
