"""Handles of non-blocking operations and their two autograd nodes (start and Wait).

A :class:`WaitHandle` carries a differentiable ``dummy`` tensor plus a
:class:`Link` shared by the operation's start node and its Wait node. In the
backward pass the Wait node starts the adjoint operation as soon as the
gradient of the result arrives, and the start node completes it: the order of
the forward calls is mirrored, and the adjoint runs while autograd computes the
gradients in between. Under ``create_graph=True`` the adjoint is started with
the differentiable non-blocking ops, so the backward is differentiable again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._errors import MpiadTypeError
from ._join import JoinDummies

Tensor = torch.Tensor


class Link:
    """State shared by the nodes of one non-blocking operation.

    ``pending.wait()`` gives the forward result; ``start_adjoint(g)`` (``g`` the
    gradient of the result, ``None`` when it got none) starts the backward
    operation and ``finish_adjoint(state)`` completes it, giving the gradient of
    the input.
    """

    __slots__ = (
        "bwd",
        "finish_adjoint",
        "keep_result",
        "name",
        "out_meta",
        "pending",
        "saved",
        "start_adjoint",
        "waited",
    )

    def __init__(
        self,
        name: str,
        pending: Any,
        start_adjoint: Callable[[Tensor | None], Any],
        finish_adjoint: Callable[[Any], Tensor],
    ) -> None:
        self.name = name
        self.pending = pending
        self.start_adjoint = start_adjoint
        self.finish_adjoint = finish_adjoint
        self.waited = False
        self.bwd: Any = None
        self.keep_result = False  # whether the backward formula needs the result (``saved``)
        self.saved: Callable[[], Tensor] | None = None  # the result, checked (saved_tensor)
        self.out_meta: tuple[torch.Size, torch.dtype, torch.device] | None = None

    def zeros_like_result(self) -> Tensor:
        if self.out_meta is None:
            raise RuntimeError(f"mpiad: the {self.name} handle was never waited for; its backward needs its Wait")
        shape, dtype, device = self.out_meta
        return torch.zeros(shape, dtype=dtype, device=device)


def saved_tensor(t: Tensor, what: str) -> Callable[[], Tensor]:
    """``t`` for a backward formula, checked as autograd checks a saved tensor: after
    an in-place change of ``t`` the getter raises instead of handing it out."""
    version = t._version

    def get() -> Tensor:
        if t._version != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: {what} is at version {t._version}; expected version {version} instead"
            )
        return t

    return get


def dummy_like(t: Tensor) -> Tensor:
    dt = t.dtype if (t.is_floating_point() or t.is_complex()) else torch.float32
    return torch.zeros((), dtype=dt, device=t.device)


class WaitHandle:
    """Handle of a pending non-blocking operation (``Isend``, ``Irecv``, ``Iallreduce``, ...).

    Pass it to :meth:`Communicator.Wait`; use :attr:`dummy` to make other
    computations depend on it (:func:`mpiad.JoinDummies`). Made by the non-blocking
    methods, not by users.

    Parameters
    ----------
    dummy : torch.Tensor
        The tensor standing for the operation in autograd (its start node's output).
    link : Link or None
        The state the operation's autograd nodes share (``None`` under torch.compile).
    """

    __slots__ = ("_dummy", "_link")

    def __init__(self, dummy: Tensor, link: Link | None) -> None:
        self._dummy = dummy
        self._link = link

    @property
    def link(self) -> Link | None:
        """The state shared by the operation's autograd nodes (``None`` under torch.compile)."""
        return self._link

    @property
    def dummy(self) -> Tensor:
        """A tensor standing for this handle in :func:`mpiad.JoinDummies`' dummy list."""
        return self._dummy

    def __repr__(self) -> str:
        if self._link is None:
            return "WaitHandle(compiled)"
        state = "done" if self._link.waited else "pending"
        return f"WaitHandle({self._link.name} {state})"


def compiled_handle(result: Tensor) -> WaitHandle:
    """The handle of a non-blocking op traced under ``torch.compile``.

    There it is traced as its blocking custom op (the same values and gradients, from
    the op's autograd formula; the compiled graph does not overlap it). The handle's
    dummy is the result itself: Wait returns it, and JoinDummies on it orders as on
    the real handle.

    Parameters
    ----------
    result : torch.Tensor
        The blocking op's result.

    Returns
    -------
    WaitHandle
        A handle without link (``Wait`` inside the compiled function returns ``result``).
    """
    return WaitHandle(result, None)


class _Start(torch.autograd.Function):
    """Start node: input = the user's tensor, output = the handle's dummy."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, link: Link) -> Tensor:
        ctx.link = link
        return dummy_like(x)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None]:
        link: Link = ctx.link
        if link.bwd is None:
            # the Wait node got no gradient (its result was not used): exchange zeros now,
            # the other ranks may need this rank's part
            link.bwd = link.start_adjoint(None)
        state, link.bwd = link.bwd, None
        return link.finish_adjoint(state), None


class _Wait(torch.autograd.Function):
    """Wait node: input = the handle's dummy, output = the operation's result."""

    @staticmethod
    def forward(ctx: Any, dummy: Tensor, link: Link, result: Tensor) -> Tensor:
        ctx.link = link
        ctx.dmeta = (dummy.shape, dummy.dtype, dummy.device)
        return result.detach()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None]:
        link: Link = ctx.link
        link.bwd = link.start_adjoint(g)
        shape, dtype, device = ctx.dmeta
        return torch.zeros(shape, dtype=dtype, device=device), None, None


def make_handle(
    t: Tensor,
    name: str,
    pending: Any,
    start_adjoint: Callable[[Tensor | None], Any],
    finish_adjoint: Callable[[Any], Tensor],
    keep_result: bool = False,
) -> WaitHandle:
    """The handle of an operation started on ``t`` (differentiable when ``t`` needs grad)."""
    link = Link(name, pending, start_adjoint, finish_adjoint)
    link.keep_result = keep_result
    if torch.is_grad_enabled() and t.requires_grad:
        return WaitHandle(_Start.apply(t, link), link)
    return WaitHandle(dummy_like(t), link)


def wait(handle: WaitHandle) -> Tensor:
    """Complete the operation of ``handle``; its result (through the Wait node when differentiable)."""
    if not isinstance(handle, WaitHandle):
        raise MpiadTypeError(f"Wait expects a WaitHandle, got {type(handle).__name__}")
    link = handle._link
    if link is None:
        raise RuntimeError("a handle created under torch.compile can only be waited for in the compiled function")
    if link.waited:
        raise RuntimeError(f"{handle!r} was already waited for; each handle can be waited for once")
    result = link.pending.wait()
    link.waited = True
    link.pending = None
    link.out_meta = (result.shape, result.dtype, result.device)
    if torch.is_grad_enabled() and handle._dummy.requires_grad:
        if link.keep_result:
            link.saved = saved_tensor(result.detach(), f"the result of {link.name}")
        return _Wait.apply(handle._dummy, link, result)
    return result.detach() if result.requires_grad else result


def JoinDummiesHandle(handle: WaitHandle, dummies: list[Tensor]) -> WaitHandle:
    """:func:`JoinDummies` for a :class:`WaitHandle` as first argument.

    Parameters
    ----------
    handle : WaitHandle
        The handle whose completion should depend on ``dummies``.
    dummies : list of torch.Tensor
        Tensors (or other handles' ``dummy``) to depend on.

    Returns
    -------
    WaitHandle
        A handle of the same operation whose dummy also depends on ``dummies``.

    Raises
    ------
    TypeError
        Not a handle, or bad dummies.
    """
    if not isinstance(handle, WaitHandle):
        raise MpiadTypeError(f"JoinDummiesHandle expects a WaitHandle, got {type(handle).__name__}")
    return WaitHandle(JoinDummies(handle._dummy, dummies), handle._link)
