"""ParallelLinear (TorchShard) and the Megatron-style Column/RowParallelLinear."""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch import nn

from distkit_common.validate import check_int

from .._ddp import check_ddp, register_if_world
from .._split import padded_size, partition_range
from .._tag import _FULL_SIZE, _PARALLEL_DIM, check_dim, register_parallel_attribute
from . import functional as PF
from .init import init_shard_


class _TaggingDict(dict):
    """``Module._parameters`` that re-attaches the parallel attributes to any parameter assigned to
    it (deferred-init materialisation, ``load_state_dict(assign=True)``, ``to_empty``, ...)."""

    def __init__(self, owner: nn.Module, items: dict[str, Any]) -> None:
        super().__init__(items)
        self._owner = weakref.ref(owner)

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        owner = self._owner()
        if owner is not None and value is not None:
            owner._register_tags()  # type: ignore[operator]

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))


def track_parameters(module: nn.Module) -> None:
    """Make ``module`` re-tag its parameters whenever they are replaced."""
    object.__setattr__(module, "_parameters", _TaggingDict(module, module._parameters))


def _tp() -> tuple[int, int]:
    from ..distributed import get_group_size, get_rank

    return get_group_size(), get_rank()


def _check_features(name: str, v: Any) -> int:
    return int(check_int(v, name, lo=1))


class ParallelLinear(nn.Module):
    """Linear layer split over the tensor-parallel group.

    The weight uses ``nn.Linear``'s layout ``[out, in]`` (order type 0), so state dicts are
    interchangeable with ``nn.Linear``:

    - ``dim=None``: plain ``nn.Linear`` (weight ``[out, in]``, replicated).
    - ``dim=-1`` or ``1`` (column): weight ``[out_local, in]``, bias ``[out_local]``; the output is
      split along its last dim and tagged ``-1``.
    - ``dim=0`` (row): weight ``[out, in_local]``, bias ``[out]`` replicated; the input is used as is
      when tagged split (else scattered), partial outputs are all-reduced and the bias is added once.

    Parameters
    ----------
    in_features, out_features : int
        Full (unsplit) sizes.
    bias : bool
        Learn an additive bias.
    dim : {None, 0, 1, -1}
        Parallel dim.
    uneven : bool
        Allow a split size that does not divide the group size (shards cut as ``torch.chunk``).
    pad_to_multiple_of : int, optional
        Column dims only (a vocabulary head): every rank stores a multiple of this many output
        rows, real rows first (Megatron's ``make_vocab_size_divisible_by``); padding rows are zero
        and their output columns are ``-inf``. Implies an uneven split where needed.
    device, dtype : optional
        Placement of the parameters (initialised on the CPU, then moved; ``meta``: not initialised).

    Raises
    ------
    ValueError
        If ``dim`` is not None/0/1/-1, the split size does not divide (and not ``uneven``), or
        ``pad_to_multiple_of`` is given for a non-column dim or is < 1.
    RuntimeError
        If ``dim`` is not None and the process groups are not initialised.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        dim: int | None = None,
        *,
        uneven: bool = False,
        pad_to_multiple_of: int | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.in_features = _check_features("in_features", in_features)
        self.out_features = _check_features("out_features", out_features)
        self.dim = check_dim(dim)
        self.uneven = bool(uneven)
        if pad_to_multiple_of is not None:
            _check_features("pad_to_multiple_of", pad_to_multiple_of)
            if dim not in (1, -1):
                raise ValueError(f"pad_to_multiple_of needs a column dim (-1 or 1), got dim={dim!r}")
        self.pad_to_multiple_of = pad_to_multiple_of
        track_parameters(self)
        out_l, in_l = out_features, in_features
        if dim is not None:
            p, r = _tp()
            if dim in (1, -1):
                if pad_to_multiple_of is not None:
                    out_l = padded_size(out_features, p, pad_to_multiple_of)
                else:
                    out_l = partition_range(out_features, p, r, uneven=uneven, what="out_features")[1]
            else:
                in_l = partition_range(in_features, p, r, uneven=uneven, what="in_features")[1]
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty((out_l, in_l), **kw))
        if bias:
            self.bias: nn.Parameter | None = nn.Parameter(torch.empty((out_l,), **kw))
        else:
            self.register_parameter("bias", None)
        self._register_tags()
        self.reset_parameters()

    def _register_tags(self) -> None:
        """(Re-)attach the parallel attributes to the parameters (also after they were replaced,
        e.g. by deferred-init materialisation or ``load_state_dict(assign=True)``)."""
        dim = self.dim
        weight, bias = self._parameters.get("weight"), self._parameters.get("bias")
        if weight is not None:
            register_parallel_attribute(weight, dim, 0)
            if dim in (1, -1):
                setattr(weight, _FULL_SIZE, self.out_features)
            elif dim == 0:
                setattr(weight, _FULL_SIZE, self.in_features)
        if bias is not None:
            register_parallel_attribute(bias, dim if dim in (1, -1) else None, 0)
            if dim in (1, -1):
                setattr(bias, _FULL_SIZE, self.out_features)

    def reset_parameters(self) -> None:
        """Initialise as ``nn.Linear`` initialises the full weight (same RNG draws), then slice."""
        init_shard_(nn.init.kaiming_uniform_, self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            init_shard_(nn.init.uniform_, self.bias, a=-bound, b=bound)

    def reset_params(self) -> None:
        """Initialise the parameters: an alias of :meth:`reset_parameters` (TorchShard's name)."""
        self.reset_parameters()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Apply the layer (see the class docstring).

        Parameters
        ----------
        input : torch.Tensor
            Input ``[*, in_features]`` (or this rank's slice of them for a row split tagged 0).

        Returns
        -------
        torch.Tensor
            The output ``[*, out_features]``, split and tagged -1 for a column split, full for a row split.
        """
        if _PARALLEL_DIM not in self.weight.__dict__:
            self._register_tags()
        check_ddp(self)
        if self.pad_to_multiple_of is not None:
            return PF.column_linear(input, self.weight, self.bias, num_outputs=self.out_features)
        return PF.parallel_linear(input, self.weight, self.bias, self.dim)

    def extra_repr(self) -> str:
        """Return the layer's arguments for its ``repr``.

        Returns
        -------
        str
            Sizes, bias and parallel dim.
        """
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, dim={self.dim}"
        )

    @classmethod
    def convert_parallel_linear(cls, module: nn.Module, dim: int | None = None, *, uneven: bool = False) -> nn.Module:
        """Replace every ``nn.Linear`` in ``module`` by a ``ParallelLinear`` (:func:`convert_parallel_linear`).

        Parameters
        ----------
        module : nn.Module
            The module, itself or with nested ``nn.Linear`` layers.
        dim : {None, 0, 1, -1}
            The parallel dim of the new layers.
        uneven : bool, default False
            Allow sizes the group size does not divide (``torch.chunk``'s split).

        Returns
        -------
        nn.Module
            The converted module (``module`` itself, modified, unless it is an ``nn.Linear``).

        Raises
        ------
        ValueError
            If ``dim`` is invalid or a size does not divide.
        RuntimeError
            If ``dim`` is not None and the process groups are not initialised.
        """
        return convert_parallel_linear(module, dim, uneven=uneven)


class ColumnParallelLinear(ParallelLinear):
    """Megatron's column-parallel linear: weight split along the output features.

    Parameters
    ----------
    in_features, out_features : int
        Full sizes.
    bias : bool
        Learn a (split) bias.
    gather_output : bool
        All-gather the output (full, untagged); else keep it split and tagged -1.
    sequence_parallel : bool
        The input is split along ``sequence_dim``: it is all-gathered forward and its gradient is
        reduce-scattered backward (instead of an all-reduce).
    sequence_dim : int
        Sequence dimension of the input (Megatron uses ``[s, b, h]``, i.e. 0).
    local_output : bool
        Return the local output as a plain tensor (no ``ParallelTensor`` tag), as DTensor's
        ``use_local_output=True``; the next layer must then be told its input is split.
    uneven : bool, default False
        As for :class:`ParallelLinear`.
    pad_to_multiple_of : int, optional
        As for :class:`ParallelLinear`.
    device : torch.device, optional
        As for :class:`ParallelLinear`.
    dtype : torch.dtype, optional
        As for :class:`ParallelLinear`.

    Raises
    ------
    ValueError
        Bad sizes, or ``gather_output`` with ``sequence_parallel`` or padding.
    RuntimeError
        If the process groups are not initialised.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        gather_output: bool = True,
        *,
        sequence_parallel: bool = False,
        sequence_dim: int = 0,
        local_output: bool = False,
        uneven: bool = False,
        pad_to_multiple_of: int | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        if gather_output and pad_to_multiple_of is not None:
            raise ValueError("gather_output=True is incompatible with pad_to_multiple_of")
        super().__init__(
            in_features,
            out_features,
            bias,
            -1,
            uneven=uneven,
            pad_to_multiple_of=pad_to_multiple_of,
            device=device,
            dtype=dtype,
        )
        self.gather_output = bool(gather_output)
        self.sequence_parallel = bool(sequence_parallel)
        self.sequence_dim = int(sequence_dim)
        self.local_output = bool(local_output)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Apply the layer.

        Parameters
        ----------
        input : torch.Tensor
            Input ``[*, in_features]`` (split along ``sequence_dim`` with ``sequence_parallel``).

        Returns
        -------
        torch.Tensor
            The output: full with ``gather_output``, else this rank's ``out_features`` slice (tagged -1 unless ``local_output``).
        """
        if _PARALLEL_DIM not in self.weight.__dict__:
            self._register_tags()
        check_ddp(self)
        return PF.column_linear(
            input,
            self.weight,
            self.bias,
            gather_output=self.gather_output,
            sequence_dim=self.sequence_dim if self.sequence_parallel else None,
            local_output=self.local_output,
            num_outputs=self.out_features,
        )


class RowParallelLinear(ParallelLinear):
    """Megatron's row-parallel linear: weight split along the input features, bias replicated.

    Parameters
    ----------
    in_features, out_features : int
        Full sizes.
    bias : bool
        Learn a bias (added once after the reduction, identical on every rank).
    input_is_parallel : bool
        The input is already split along its last dim (else it is scattered).
    sequence_parallel : bool
        Reduce-scatter the output along ``sequence_dim`` instead of all-reducing it (requires
        ``input_is_parallel``); the bias gradient is then summed over the group.
    sequence_dim : int
        Sequence dimension of the output.
    uneven : bool, default False
        As for :class:`ParallelLinear`.
    device : torch.device, optional
        As for :class:`ParallelLinear`.
    dtype : torch.dtype, optional
        As for :class:`ParallelLinear`.

    Raises
    ------
    ValueError
        Bad sizes, or ``sequence_parallel`` without ``input_is_parallel``.
    RuntimeError
        If the process groups are not initialised.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        input_is_parallel: bool = False,
        *,
        sequence_parallel: bool = False,
        sequence_dim: int = 0,
        uneven: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        if sequence_parallel and not input_is_parallel:
            raise ValueError("sequence_parallel=True requires input_is_parallel=True")
        super().__init__(in_features, out_features, bias, 0, uneven=uneven, device=device, dtype=dtype)
        self.input_is_parallel = bool(input_is_parallel)
        self.sequence_parallel = bool(sequence_parallel)
        self.sequence_dim = int(sequence_dim)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Apply the layer.

        Parameters
        ----------
        input : torch.Tensor
            Input ``[*, in_features]``, or this rank's slice of the features with ``input_is_parallel``.

        Returns
        -------
        torch.Tensor
            The full output ``[*, out_features]`` (split along ``sequence_dim`` with ``sequence_parallel``).
        """
        if _PARALLEL_DIM not in self.weight.__dict__:
            self._register_tags()
        check_ddp(self)
        return PF.row_linear(
            input,
            self.weight,
            self.bias,
            input_is_parallel=self.input_is_parallel,
            sequence_dim=self.sequence_dim if self.sequence_parallel else None,
        )


def _convert(module: nn.Module, make: Any) -> nn.Module:
    new = make(module)
    if new is not None:
        return new
    for name, child in list(module.named_children()):
        setattr(module, name, _convert(child, make))
    return module


def convert_parallel_linear(module: nn.Module, dim: int | None = None, *, uneven: bool = False) -> nn.Module:
    """Replace every ``nn.Linear`` in ``module`` by a :class:`ParallelLinear` holding its slice.

    Every ``nn.Linear`` (nested too) becomes a layer with parallel dim ``dim`` holding the matching
    slice of the original parameters. When the tensor-parallel group is the whole world, the split parameters are also listed in
    the returned module's ``_ddp_params_and_buffers_to_ignore``, as TorchShard's did, so that
    ``DistributedDataParallel(module)`` over the world does not average different shards.

    Parameters
    ----------
    module : nn.Module
        The module, itself an ``nn.Linear`` or holding nested ones.
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
        if type(m) is not nn.Linear:
            return None
        new = ParallelLinear(
            m.in_features,
            m.out_features,
            m.bias is not None,
            dim,
            uneven=uneven,
            device=m.weight.device,
            dtype=m.weight.dtype,
        )
        _load_slices(new, m)
        return new

    return register_if_world(_convert(module, make))


def _load_slices(new: nn.Module, old: nn.Module) -> None:
    from .._state_dict import relocate_state_dict

    sd = relocate_state_dict(new, old.state_dict())
    new.load_state_dict(sd)
