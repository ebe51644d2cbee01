"""``mpiad.DataParallel``: data-parallel training with bucketed, overlapped gradient averaging.

What torch's DistributedDataParallel does, over an mpiad communicator: the
gradients are grouped into buckets (25 MB by default, in reverse parameter
order, so the first bucket fills first during backward); as soon as every
gradient of a bucket has been accumulated, the bucket is averaged over the
ranks with a non-blocking all-reduce (``MPI_AVG``) that runs on mpiad's worker
thread while autograd computes the rest of the backward. Buckets start in
bucket order on every rank (a bucket that is ready early waits for the ones
before it), so the collectives match. At the end of backward every bucket is
waited for and the averaged gradients are in ``p.grad``: call the optimizer.

Parameters that get no gradient on a rank contribute zeros; a parameter that
got none on any rank keeps ``grad is None`` (what single-process training
gives). :meth:`DataParallel.no_sync` accumulates gradients locally.

As in DDP, whether a backward averages is decided by the forward it follows:
a forward through the wrapper (with grad enabled, outside ``no_sync``) makes
the next backward average, once; a backward of the bare module's output
never communicates. Each bucket has two buffers: ``p.grad`` is a view of the
one gradients accumulate into, and the all-reduce writes into the other,
which holds ``p.grad`` after the round. So a round that a failed backward
left unfinished never writes into the gradients the user sees; the next
forward completes it (every rank then issued the same collectives) and
discards its result.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from . import _mpiad
from ._checks import CODE, check_tensor
from ._comm import COMM_WORLD, Communicator
from ._constants import MPI_AVG, MPI_SUM
from ._errors import MpiadTypeError, MpiadValueError
from ._signatures import NONBLOCKING, OP_ALLREDUCE, debug_check
from ._staging import cuda_aware, sync_device, write_back

Tensor = torch.Tensor
_HALF = (torch.float16, torch.bfloat16)


class _Bucket:
    """Gradients of some parameters (one dtype and device) in flat buffers.

    Layout: each parameter's gradient, then one "has a gradient" flag per
    parameter; averaged over the ranks, a flag > 0 means some rank had one.
    ``flat`` is what gradients accumulate into (``p.grad`` is a view of it
    after the first round), ``out`` what the all-reduce writes; they swap
    when a round ends.
    """

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.offsets: list[int] = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.grad_numel = n
        p0 = params[0]
        self.flat = torch.zeros(n + len(params), dtype=p0.dtype, device=p0.device)
        self.out = torch.zeros_like(self.flat)
        self.reset()

    def view(self, buf: Tensor, i: int) -> Tensor:
        p = self.params[i]
        return buf[self.offsets[i] : self.offsets[i] + p.numel()].view_as(p)

    def reset(self) -> None:
        self.marked: set[int] = set()  # the parameters whose gradients are complete this round
        self.req: Any = None
        self.host: Tensor | None = None  # pinned staging copy of a CUDA bucket (MPI not CUDA-aware)


class DataParallel(torch.nn.Module):
    """Wrap ``module`` for data-parallel training over ``comm`` (torch DDP's behaviour).

    Parameters
    ----------
    module : torch.nn.Module
        The model; every rank must build the same parameters (names, shapes, dtypes).
    comm : Communicator, optional
        Default :data:`mpiad.COMM_WORLD`.
    bucket_cap_mb : float
        Bucket size in megabytes (10^6 bytes, as torch DDP), default 25.
    broadcast_buffers : bool
        Broadcast rank 0's buffers (e.g. BatchNorm statistics) before each forward.
    init_sync : bool
        Broadcast rank 0's parameters and buffers at construction, so every rank starts alike.

    Raises
    ------
    TypeError
        ``module`` is not a Module, ``comm`` not a Communicator.
    ValueError
        ``bucket_cap_mb`` not positive; the ranks' parameters differ (on every rank).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        comm: Communicator | None = None,
        *,
        bucket_cap_mb: float = 25.0,
        broadcast_buffers: bool = True,
        init_sync: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise MpiadTypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if comm is None:
            comm = COMM_WORLD
        if not isinstance(comm, Communicator):
            raise MpiadTypeError(f"comm must be an mpiad Communicator, got {type(comm).__name__}")
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
            raise MpiadValueError(f"bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        self.module = module
        self.comm = comm
        self.broadcast_buffers = bool(broadcast_buffers)
        self._sync = True
        self._armed = False  # a forward through the wrapper asked its backward to average
        self._round_open = False  # a gradient of the current round arrived; _finish is queued
        params = [p for p in module.parameters() if p.requires_grad]
        for i, p in enumerate(params):
            check_tensor(p, f"parameter {i}")
        self._check_same_parameters(params)
        if init_sync:
            with torch.no_grad():
                for t in [*module.parameters(), *module.buffers()]:
                    self.comm.Bcast_(t.data, 0)
        self._buckets = self._make_buckets(params, int(bucket_cap_mb * 1e6))
        self._next = 0  # the next bucket to start: buckets start in order
        self._hooks = []
        for b, bucket in enumerate(self._buckets):
            for i, p in enumerate(bucket.params):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._hook(b, i)))

    # ----------------------------------------------------------- setup
    def _check_same_parameters(self, params: list[torch.nn.Parameter]) -> None:
        sig = [len(params)]
        for p in params:
            sig += [p.numel(), CODE[p.dtype]]
        lengths = _mpiad.allgather_i64(self.comm.handle, [len(sig)])
        if len(set(lengths)) == 1:
            flat = _mpiad.allgather_i64(self.comm.handle, sig)
            sigs = [flat[i : i + len(sig)] for i in range(0, len(flat), len(sig))]
            if all(s == sigs[0] for s in sigs):
                return
        raise MpiadValueError(
            "DataParallel: the ranks' models differ (number, sizes or dtypes of the parameters that require grad): "
            f"{[n - 1 for n in lengths]} parameter(s) per rank"
        )

    @staticmethod
    def _make_buckets(params: list[torch.nn.Parameter], cap: int) -> list[_Bucket]:
        # reverse order: gradients become ready roughly from the last layer to the first
        buckets: list[_Bucket] = []
        cur: list[torch.nn.Parameter] = []
        size = 0
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            if cur and (size + nbytes > cap or p.dtype != cur[0].dtype or p.device != cur[0].device):
                buckets.append(_Bucket(cur))
                cur, size = [], 0
            cur.append(p)
            size += nbytes
        if cur:
            buckets.append(_Bucket(cur))
        return buckets

    @property
    def bucket_count(self) -> int:
        """The number of gradient buckets."""
        return len(self._buckets)

    @property
    def buckets(self) -> list[Tensor]:
        """The buckets' buffers that gradients accumulate into, in order.

        Each holds its parameters' gradients, then one has-a-gradient flag per parameter.
        """
        return [b.flat for b in self._buckets]

    # ----------------------------------------------------------- forward
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; its backward then all-reduces the gradients bucket by bucket.

        Parameters
        ----------
        *args, **kwargs
            Passed to the wrapped module.

        Returns
        -------
        object
            What the wrapped module returns.
        """
        if self._round_open:
            self._complete_abandoned_round()
        if self.broadcast_buffers and self._sync:
            with torch.no_grad():
                for t in self.module.buffers():
                    self.comm.Bcast_(t.data, 0)
        if torch.is_grad_enabled():  # (a no-grad forward, e.g. evaluation, changes nothing)
            self._armed = self._sync
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside: backward accumulates gradients locally (no communication), as DDP's no_sync.

        As in DDP, what counts is where the forward runs: the backward of a
        forward made inside the context accumulates locally, wherever it runs.

        Yields
        ------
        None
            Control to the block; gradient synchronization is restored on exit.
        """
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # ---------------------------------------------------------- backward
    def _hook(self, b: int, i: int) -> Any:
        def hook(p: Tensor) -> None:
            if not self._armed:
                return
            bucket = self._buckets[b]
            if i in bucket.marked:
                # a second gradient in one backward (a parameter used in two reentrant
                # checkpoints): still in time while its bucket waits, else it would be lost
                if bucket.req is not None:
                    raise RuntimeError(
                        "mpiad.DataParallel: a parameter received a gradient after its bucket was already being "
                        "averaged (it is used in several reentrant backward passes, e.g. torch.utils.checkpoint "
                        "with use_reentrant=True); use use_reentrant=False, as torch DDP requires"
                    )
                return
            bucket.marked.add(i)
            if not self._round_open:
                self._round_open = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._start_ready()

        return hook

    def _start_ready(self) -> None:
        while self._next < len(self._buckets) and len(self._buckets[self._next].marked) == len(
            self._buckets[self._next].params
        ):
            self._start(self._buckets[self._next])
            self._next += 1

    def _start(self, bucket: _Bucket) -> None:
        flat = bucket.flat
        with torch.no_grad():
            for i, p in enumerate(bucket.params):
                view = bucket.view(flat, i)
                if p.grad is None:
                    view.zero_()
                    flat[bucket.grad_numel + i] = 0
                else:
                    if p.grad.data_ptr() != view.data_ptr():
                        view.copy_(p.grad)
                    flat[bucket.grad_numel + i] = 1
        h = self.comm.handle
        op = MPI_AVG
        src, dst = flat, bucket.out
        if flat.dtype in _HALF:
            # divide first, as DDP's default hook does: a sum of 16-bit gradients
            # overflows where their average fits; the all-reduce then sums in place
            with torch.no_grad():
                torch.div(flat, self.comm.size, out=dst)
            src, op = dst, MPI_SUM
        debug_check(h, OP_ALLREDUCE + NONBLOCKING, flat, op)
        if flat.is_cuda:
            if cuda_aware():
                sync_device(src)
            else:
                host = bucket.host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
                host.copy_(src)
                src = dst = host
        bucket.req = _mpiad.iallreduce(h, src.data_ptr(), dst.data_ptr(), src.nbytes, CODE[src.dtype], op, (src, dst))

    def _wait_all(self) -> None:
        """Start what is left (buckets with unused parameters), in order, and wait for every bucket."""
        for bucket in self._buckets[self._next :]:
            self._start(bucket)
        for bucket in self._buckets:
            bucket.req.wait()
            if bucket.host is not None:
                write_back(bucket.out, bucket.host)

    def _reset_round(self) -> None:
        self._round_open = False
        self._armed = False
        self._next = 0
        for bucket in self._buckets:
            bucket.reset()

    def _finish(self) -> None:
        """End of backward: wait for every bucket; hand the averaged gradients to the parameters."""
        try:
            self._wait_all()
            for bucket in self._buckets:
                flags = bucket.out[bucket.grad_numel :].tolist()
                for i, p in enumerate(bucket.params):
                    if flags[i] > 0:
                        # the gradient becomes a view of the bucket: the next backward
                        # accumulates into it directly (no copy at the next start)
                        p.grad = bucket.view(bucket.out, i)
                bucket.flat, bucket.out = bucket.out, bucket.flat
        finally:
            self._reset_round()

    def _complete_abandoned_round(self) -> None:
        """A backward raised after some gradients arrived: _finish never ran. Issue
        the rest of that round's collectives (the other ranks wait for them, or
        issued them too) and discard the result, which lands in the buffers no
        ``p.grad`` views."""
        warnings.warn(
            "mpiad.DataParallel: the previous backward ended early (it raised); its gradient all-reduces were "
            "completed with this rank's partial gradients to keep the ranks' collectives matched, and their result "
            "discarded",
            RuntimeWarning,
            stacklevel=3,
        )
        try:
            self._wait_all()
        finally:
            self._reset_round()
