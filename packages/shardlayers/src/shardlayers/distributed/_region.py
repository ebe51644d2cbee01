"""Entering a tensor-parallel region from a replicated tensor: one input-gradient all-reduce per
tensor, however many column-parallel layers read it.

Every column-parallel layer fed a replicated input owes the group an all-reduce of its input
gradient (Megatron's ``f``). Sibling layers reading the same tensor -- q/k/v projections,
gate/up projections -- would each all-reduce their own part and autograd would then add the
reduced parts: three all-reduces where one of the sum suffices. Megatron avoids it by fusing
QKV into one linear; DTensor's ``ColwiseParallel`` does not (one all-reduce per layer). Here
the model's modules stay untouched: the layers reading one tensor share a :class:`Region`.
Each layer's backward adds its input gradient into the region's buffer; the last one to arrive
starts one asynchronous all-reduce of the sum and computes its weight gradient while it runs;
the region's entry node (whose backward autograd runs after every reader's) waits for it and
hands the reduced gradient to the input.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.weak import WeakIdKeyDictionary

#: replicated source tensor -> (its _version at entry, group, entered tensor, region)
_ENTRIES: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _graph_task() -> int:
    """Id of the running backward pass (what ``torch.utils.checkpoint`` keys its state by): a
    retained graph can be differentiated again, partly (``autograd.grad`` of some weights only)."""
    return int(torch._C._current_graph_task_id())


class Region:
    """The shared input-gradient all-reduce of the column-parallel layers reading one tensor."""

    __slots__ = ("arrived", "buffer", "group", "handle", "overlap", "readers", "reduced", "task")

    def __init__(self, group: Any, overlap: bool) -> None:
        self.group = group
        self.overlap = overlap
        self.readers = 0  # layers that read the tensor with autograd on (counted in forward)
        self.arrived = 0  # their input gradients added so far (backward)
        self.buffer: torch.Tensor | None = None
        self.handle: Any = None
        self.reduced = False  # the all-reduce of the sum was started
        self.task = -1  # the backward pass (autograd graph task) the buffer belongs to

    def add(self, grad: torch.Tensor) -> None:
        """Add one reader's input gradient (a fresh tensor the region may keep and modify); the
        last reader's starts the all-reduce of the sum."""
        task = _graph_task()
        if self.task != task:  # left over from a pass that did not reach the input (autograd.grad of weights)
            self._reset()
            self.task = task
        self.buffer = grad if self.buffer is None else self.buffer.add_(grad)
        self.arrived += 1
        if self.arrived == self.readers:
            # async: a work handle; sync (overlap off): done now, None
            self.handle = dist.all_reduce(self.buffer, group=self.group, async_op=self.overlap)
            self.reduced = True

    def take(self) -> torch.Tensor | None:
        """The reduced sum (waiting for the all-reduce), and a reset for another backward."""
        if self.task != _graph_task():  # no reader of this pass added anything
            self._reset()
            return None
        out, handle = self.buffer, self.handle
        if out is not None:
            if not self.reduced:  # a reader never ran its backward (its output was unused)
                dist.all_reduce(out, group=self.group)
            elif handle is not None:
                handle.wait()
        self._reset()
        return out

    def _reset(self) -> None:
        self.buffer, self.handle, self.arrived, self.reduced, self.task = None, None, 0, False, -1


class _Enter(torch.autograd.Function):
    """Identity forward; backward hands over the region's reduced gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, region: Region) -> torch.Tensor:
        ctx.region = region
        ctx.source = weakref.ref(x)
        ctx.set_materialize_grads(False)  # readers return None for this input: nothing to add
        # a detached alias, not a view: the cache below must not keep ``x`` alive
        return x.detach()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor | None) -> tuple[torch.Tensor | None, None]:
        src = ctx.source()
        if src is not None:  # the graph through this entry is consumed: enter afresh next time
            _ENTRIES.pop(src, None)
        out = ctx.region.take()
        if g is not None:  # someone else used the entered tensor: its gradient is a partial sum too
            g = g.contiguous().clone()
            dist.all_reduce(g, group=ctx.region.group)
            out = g if out is None else out.add_(g)
        return out, None


def enter_region(x: torch.Tensor, group: Any, overlap: bool) -> tuple[torch.Tensor, Region | None]:
    """``x`` as the input of one more column-parallel layer, and the region whose all-reduce that
    layer's backward joins (None when no input gradient is needed or the group has one rank).

    The readers of one tensor (same object, unchanged since) share the region.
    """
    if not (torch.is_grad_enabled() and x.requires_grad) or dist.get_world_size(group) == 1:
        return x, None
    hit = _ENTRIES.get(x)
    if hit is not None:
        version, hgroup, entered, region = hit
        if version == x._version and hgroup is group and region.arrived == 0:
            region.readers += 1
            return entered, region
    region = Region(group, overlap)
    region.readers = 1
    entered = _Enter.apply(x, region)
    _ENTRIES[x] = (x._version, group, entered, region)
    return entered, region
