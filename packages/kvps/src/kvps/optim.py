"""Server-side optimizers: the update rule a :class:`kvps.Server` applies where the rows live.

``kvps.Server(dim, optimizer=kvps.optim.RowWiseAdagrad(lr=0.05))`` makes every
``push`` carry gradients: the key's owner (or a replica, whose accumulated
gradients the owner applies at the next sync round) runs one optimizer step
with them. The optimizer state is stored next to each row on the server, moves
with the key, and is saved and loaded with the server state. ``pull`` returns
the parameters only; ``set`` overwrites the parameters and keeps the state.

For a key updated by one rank at a time (not replicated), the steps give the
numbers ``torch.optim`` gives on the same row with the same gradients (the
operations and their rounding follow torch's CPU kernels; torch's own ``sqrt``
on CPU is not always correctly rounded, kvps's is, so results may differ in
the last bit where torch's square root does). Adam keeps the step count per
row, so a row that is not in a batch is not updated (as TorchRec's fused
optimizers, not as a dense ``torch.optim.Adam``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from . import _kvps

__all__ = ["SGD", "Adagrad", "Adam", "Optimizer", "RowWiseAdagrad"]


def _number(v: Any, name: str, *, lo: float = 0.0, hi: float | None = None, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(v).__name__}")
    x = float(v)
    if not math.isfinite(x) or x < lo or (lo_open and x == lo) or (hi is not None and x >= hi):
        bound = f"({lo}, " if lo_open else f"[{lo}, "
        raise ValueError(f"{name} must be in {bound}{'inf' if hi is None else hi}), got {v!r}")
    return x


@dataclass(frozen=True)
class Optimizer:
    """Base of the update rules; use one of the subclasses."""

    name: ClassVar[str] = "add"

    def _engine_args(self) -> tuple[int, float, float, float, float]:
        """(rule code, lr, eps, beta1, beta2) for the native engine."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """Describe the rule: its name and hyperparameters (JSON-compatible).

        Returns
        -------
        dict
            ``{"name": ..., <hyperparameter>: <value>, ...}``; checkpoints store it.
        """
        return {"name": self.name, **{k: v for k, v in self.__dict__.items()}}


@dataclass(frozen=True)
class SGD(Optimizer):
    """``p -= lr * g`` (``torch.optim.SGD`` without momentum or weight decay).

    Parameters
    ----------
    lr : float, default 1e-3
        Learning rate (a finite number >= 0).

    Raises
    ------
    TypeError, ValueError
        ``lr`` is not a finite number >= 0.
    """

    lr: float = 1e-3
    name: ClassVar[str] = "sgd"

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _number(self.lr, "lr"))

    def _engine_args(self) -> tuple[int, float, float, float, float]:
        return (_kvps.RULES[self.name], self.lr, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class _LrEps(Optimizer):
    """The checks and engine arguments of the rules that take only ``lr`` and ``eps``."""

    lr: float = 1e-2
    eps: float = 1e-10

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _number(self.lr, "lr"))
        object.__setattr__(self, "eps", _number(self.eps, "eps"))

    def _engine_args(self) -> tuple[int, float, float, float, float]:
        return (_kvps.RULES[self.name], self.lr, self.eps, 0.0, 0.0)


@dataclass(frozen=True)
class Adagrad(_LrEps):
    """``torch.optim.Adagrad`` (no lr decay or weight decay; accumulators start at 0).

    State: one accumulator per element.

    Parameters
    ----------
    lr : float, default 1e-2
        Learning rate (a finite number >= 0).
    eps : float, default 1e-10
        Added to the denominator's square root (a finite number >= 0).

    Raises
    ------
    TypeError, ValueError
        ``lr`` or ``eps`` is not a finite number >= 0.
    """

    lr: float = 1e-2
    eps: float = 1e-10
    name: ClassVar[str] = "adagrad"


@dataclass(frozen=True)
class RowWiseAdagrad(_LrEps):
    """Row-wise Adagrad, TorchRec/FBGEMM's default for embedding tables.

    One accumulator per row: ``acc += mean(g**2)``; ``p -= lr * g / (sqrt(acc) + eps)``.

    Parameters
    ----------
    lr : float, default 1e-2
        Learning rate (a finite number >= 0).
    eps : float, default 1e-8
        Added to the denominator's square root (a finite number >= 0).

    Raises
    ------
    TypeError, ValueError
        ``lr`` or ``eps`` is not a finite number >= 0.
    """

    lr: float = 1e-2
    eps: float = 1e-8
    name: ClassVar[str] = "rowwise_adagrad"


@dataclass(frozen=True)
class Adam(Optimizer):
    """``torch.optim.Adam`` (no amsgrad, no weight decay) with a step count per row.

    State: first and second moment per element and the row's step count.

    Parameters
    ----------
    lr : float, default 1e-3
        Learning rate (a finite number >= 0).
    betas : tuple of float, default (0.9, 0.999)
        Decay rates of the first and second moment, each in ``[0, 1)``.
    eps : float, default 1e-8
        Added to the denominator's square root (a finite number >= 0).

    Raises
    ------
    TypeError, ValueError
        ``lr`` or ``eps`` not a finite number >= 0, or a beta outside ``[0, 1)``.
    """

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    name: ClassVar[str] = "adam"

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _number(self.lr, "lr"))
        object.__setattr__(self, "eps", _number(self.eps, "eps"))
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise TypeError(f"betas must be a pair of numbers, got {self.betas!r}")
        b1 = _number(self.betas[0], "betas[0]", hi=1.0)
        b2 = _number(self.betas[1], "betas[1]", hi=1.0)
        object.__setattr__(self, "betas", (b1, b2))

    def _engine_args(self) -> tuple[int, float, float, float, float]:
        return (_kvps.RULES[self.name], self.lr, self.eps, self.betas[0], self.betas[1])
