"""A trainable embedding over any wholemem tensor type, with sparse in-place optimizers."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from distkit_common.dtypes import code_of

from . import _checks, _gpu, _lib
from . import _wholemem as _native
from ._comm import WholeMemoryCommunicator
from ._create import create_wm_tensor
from ._io import load_local, store_local
from ._layout import local_range, rows_per_rank
from ._ops import communicator_of, gather, get_local_tensor
from ._route import from_bytes, route, send_rows
from ._tensor import WmTensor, WmTensorType
from ._wholemem import Table, optim_update

# The update rules are those of WholeGraph's embedding optimizer kernels (optimizer.cuh),
# applied to the rows that got a gradient (duplicates summed first), with
# ``g = grad + weight_decay * w`` for every optimizer.


@dataclass
class SGD:
    """Sparse SGD: ``w -= lr * (g + weight_decay * w)`` on the rows that got a gradient.

    Parameters
    ----------
    lr : float
        Learning rate.
    weight_decay : float
        Added to the gradient as ``weight_decay * w``.
    """

    lr: float = 0.01
    weight_decay: float = 0.0
    kind = _native.OPTIM_SGD
    num_states = _native.optim_num_states(kind)


@dataclass
class Adagrad:
    """Sparse Adagrad: ``s += g^2; w -= lr * g / (sqrt(s) + eps)`` on touched rows.

    WholeGraph's defaults: ``eps=1e-8``, accumulator starting at 0.

    Parameters
    ----------
    lr : float
        Learning rate.
    eps : float
        Added to ``sqrt(s)``.
    weight_decay : float
        Added to the gradient as ``weight_decay * w``.
    initial_accumulator_value : float
        Starting value of ``s``.
    """

    lr: float = 0.01
    eps: float = 1e-8
    weight_decay: float = 0.0
    initial_accumulator_value: float = 0.0
    kind = _native.OPTIM_ADAGRAD
    num_states = _native.optim_num_states(kind)


@dataclass
class LazyAdam:
    """Lazy Adam as in WholeGraph: a row's moments and bias correction move only when it has a gradient.

    With ``t`` = the number of updates this row has had (kept per row as
    ``beta1^t, beta2^t``): ``m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
    w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.

    Parameters
    ----------
    lr : float
        Learning rate.
    betas : tuple of (float, float)
        ``(b1, b2)``.
    eps : float
        Added to the corrected ``sqrt(v)``.
    weight_decay : float
        Added to the gradient as ``weight_decay * w``.
    """

    lr: float = 0.001
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    kind = _native.OPTIM_LAZY_ADAM
    num_states = _native.optim_num_states(kind)


@dataclass
class RMSProp:
    """Sparse RMSProp: ``v = alpha*v + (1-alpha)*g^2; w -= lr * g / (sqrt(v) + eps)`` on touched rows.

    Parameters
    ----------
    lr : float
        Learning rate.
    alpha : float
        Decay of ``v``.
    eps : float
        Added to ``sqrt(v)``.
    weight_decay : float
        Added to the gradient as ``weight_decay * w``.
    """

    lr: float = 0.01
    alpha: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0
    kind = _native.OPTIM_RMSPROP
    num_states = _native.optim_num_states(kind)


Optimizer = SGD | Adagrad | LazyAdam | RMSProp


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, indices: torch.Tensor, module: Embedding) -> torch.Tensor:
        ctx.module = module
        ctx.indices = indices
        return gather(module.weight, indices)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx.module._pending.append((ctx.indices, grad.detach()))
        return None, None, None


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class Embedding(nn.Module):
    """An embedding table stored as a wholemem tensor, trained with a sparse optimizer.

    ``forward(indices)`` looks rows up (collective for NCCL tensors); ``backward`` records
    the sparse gradient; :meth:`step` (collective) sends every gradient row to the rank
    that owns it, sums duplicates and updates the rows and the optimizer state in place.

    Parameters
    ----------
    comm : WholeMemoryCommunicator
        The ranks that share the table.
    num_embeddings : int
        Number of rows.
    embedding_dim : int
        Length of a row.
    optimizer : SGD, Adagrad, LazyAdam or RMSProp, optional
        Without one, :meth:`step` raises.
    tensor_type : WmTensorType
        Storage of the table (HOST, CHUNKED, NCCL, or DEVICE on a GPU).
    dtype : torch.dtype
        A floating dtype (16-bit tables keep float32 optimizer state).
    init : torch.Tensor, optional
        The full ``[num_embeddings, embedding_dim]`` initial table (every rank copies its
        rows); default: normal(0, 1) drawn from ``seed`` in blocks of 4096 rows
        (the same table for any number of ranks).
    seed : int
        Seed of the default initialisation.
    device : str or torch.device, optional
        As for :func:`create_wm_tensor`: ``'cuda'`` keeps the table, its optimizer state
        and the gradient exchange (NCCL) on the GPU, and runs the CUDA optimizer kernel.

    Raises
    ------
    TypeError
        A non-floating dtype or an unknown optimizer.
    ValueError
        ``init`` of the wrong shape, or a GPU table on a communicator that cannot run NCCL.
    RuntimeError
        A GPU table without a usable GPU (raised on every rank).
    """

    def __init__(
        self,
        comm: WholeMemoryCommunicator,
        num_embeddings: int,
        embedding_dim: int,
        *,
        optimizer: Optimizer | None = None,
        tensor_type: WmTensorType = WmTensorType.HOST,
        dtype: torch.dtype = torch.float32,
        init: torch.Tensor | None = None,
        seed: int = 0,
        device: Any = None,
    ) -> None:
        super().__init__()
        if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise TypeError(f"Embedding needs a floating dtype, got {dtype}")
        if optimizer is not None and not isinstance(optimizer, (SGD, Adagrad, LazyAdam, RMSProp)):
            raise TypeError(f"optimizer must be wholemem SGD, Adagrad, LazyAdam or RMSProp, got {optimizer!r}")
        self.comm = comm
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.optimizer = optimizer
        self.weight = create_wm_tensor(comm, [num_embeddings, embedding_dim], [], dtype, tensor_type, device=device)
        # GPU-resident tables (DEVICE, or device='cuda'): optimizer state next to the rows,
        # gradients exchanged over the communicator's NCCL group, CUDA optimizer kernel
        w = self.weight
        self._gpu = tensor_type is WmTensorType.DEVICE or (isinstance(w, WmTensor) and w.is_gpu)
        self._device = w.device
        if self._gpu:
            problem = comm.device_group_problem(self._device)
            if problem:  # the same on every rank
                raise ValueError(f"a GPU-resident Embedding exchanges gradients with NCCL: {problem}")
            comm.ensure_device_group(self._device)  # collective
        local, first = get_local_tensor(self.weight)
        with torch.no_grad():
            if init is not None:
                if tuple(init.shape) != (self.num_embeddings, self.embedding_dim):
                    raise ValueError(f"init must have shape {(num_embeddings, embedding_dim)}, got {tuple(init.shape)}")
                local.copy_(init[first : first + local.shape[0]])
            else:
                # blocks of rows drawn from their own seed: the same table for any number of ranks
                blk = 4096
                n = local.shape[0]
                for b in range(first // blk, (first + n + blk - 1) // blk):
                    g = torch.Generator().manual_seed(seed * 1_000_003 + b)
                    rows = torch.randn(blk, self.embedding_dim, generator=g)
                    lo, hi = max(first, b * blk), min(first + n, (b + 1) * blk)
                    local[lo - first : hi - first].copy_(rows[lo - b * blk : hi - b * blk])
        acc = _acc_dtype(dtype)
        dev = local.device
        init_state = optimizer.initial_accumulator_value if isinstance(optimizer, Adagrad) else 0.0
        nstates = optimizer.num_states if optimizer is not None else 0
        self._states = [
            torch.full((local.shape[0], self.embedding_dim), init_state if i == 0 else 0.0, dtype=acc, device=dev)
            for i in range(nstates)
        ]
        # LazyAdam: per-row (beta1^t, beta2^t), starting at 1 (t = 0), as WholeGraph's per-embedding state
        self._row_state = (
            torch.ones((local.shape[0], 2), dtype=acc, device=dev) if isinstance(optimizer, LazyAdam) else None
        )
        self._step = 0
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._anchor = torch.empty(0, requires_grad=True)
        # the optimizer's view of this rank's rows, built once (a device table uploads its
        # chunk address once; a table per step would stall the GPU twice per step)
        self._table = self._local_table(local)
        comm.barrier()

    def extra_repr(self) -> str:
        """Describe the table in the module's ``repr``.

        Returns
        -------
        str
            Size, optimizer and storage.
        """
        return f"{self.num_embeddings}, {self.embedding_dim}, optimizer={self.optimizer}, type={self.weight!r:.60}"

    def forward(self, indices: Any) -> torch.Tensor:
        """Look up rows ``indices`` (1-D) of the table, differentiably (collective for NCCL tables).

        Parameters
        ----------
        indices : torch.Tensor or numpy.ndarray
            1-D int32 or int64 row indices.

        Returns
        -------
        torch.Tensor
            ``[len(indices), embedding_dim]``; its gradient is recorded for :meth:`step`.

        Raises
        ------
        IndexError
            An index outside ``[0, num_embeddings)``.
        TypeError
            Indices that are not int32 / int64.
        RuntimeError
            Library finalized or communicator destroyed.
        """
        self._check("Embedding.forward")
        idx = _checks.indices(indices, self._device, self.num_embeddings)
        out: torch.Tensor = _Lookup.apply(self._anchor, idx, self)
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients recorded since the last :meth:`step`.

        Parameters
        ----------
        set_to_none : bool
            Accepted for ``nn.Module.zero_grad``'s signature; the recorded gradients are dropped either way.
        """
        self._pending.clear()

    @property
    def optimizer_states(self) -> list[torch.Tensor]:
        """Return this rank's optimizer state rows.

        Returns
        -------
        list of torch.Tensor
            Adagrad: sum of squares; LazyAdam: m, v, and the per-row ``[beta1^t, beta2^t]``;
            RMSProp: v; SGD: none.
        """
        return self._states + ([self._row_state] if self._row_state is not None else [])

    @property
    def step_count(self) -> int:
        """Return the number of optimizer steps taken.

        Returns
        -------
        int
            Steps since the table was made (or loaded).
        """
        return self._step

    def _check(self, what: str) -> None:
        _lib.require_init(what)
        communicator_of(self.weight, what)

    def _local_table(self, local: torch.Tensor) -> Table:
        n = local.shape[0]
        st = local.stride()
        on_device = self._gpu and _gpu.backend().on_device
        index = -1 if not on_device or local.device.index is None else int(local.device.index)
        return Table(
            [int(local.data_ptr())],
            max(1, n),
            n,
            self.embedding_dim,
            st[0],
            st[1],
            code_of(local.dtype),
            on_device,
            index,
        )

    def step(self) -> None:
        """Collective: apply the recorded sparse gradients with the optimizer, in place.

        Raises
        ------
        RuntimeError
            No optimizer, or the communicator / library is gone.
        """
        self._check("Embedding.step")
        opt = self.optimizer
        if opt is None:
            raise RuntimeError("Embedding.step: no optimizer was given")
        acc = _acc_dtype(self.weight.dtype)
        d = self.embedding_dim
        if self._pending:
            idx = torch.cat([i.to(torch.int64) for i, _ in self._pending])
            grads = torch.cat([g.reshape(-1, d).to(acc) for _, g in self._pending])
        else:
            dev = self._device
            idx, grads = torch.empty(0, dtype=torch.int64, device=dev), torch.empty((0, d), dtype=acc, device=dev)
        self._pending.clear()
        comm = self.comm
        rpr = rows_per_rank(self.num_embeddings, comm.size)
        first = local_range(self.num_embeddings, comm.size, comm.rank)[0]
        if comm.size > 1:
            r, ridx = route(comm, idx, rpr)
            rgrads = from_bytes(send_rows(comm, r, grads), acc, ridx.numel(), (d,))
        else:
            ridx, rgrads = idx, grads
        uniq, inv = torch.unique(ridx - first, return_inverse=True)
        summed = torch.zeros((uniq.numel(), d), dtype=acc, device=uniq.device).index_add_(0, inv, rgrads)
        self._step += 1
        rs = self._row_state
        table = self._table
        stream = _gpu.backend().stream(self._device) if table.on_device else 0
        s = self._states
        optim_update(
            opt.kind,
            table,
            int(uniq.data_ptr()),
            int(uniq.numel()),
            int(summed.data_ptr()),
            int(s[0].data_ptr()) if len(s) > 0 else 0,
            int(s[1].data_ptr()) if len(s) > 1 else 0,
            int(rs.data_ptr()) if rs is not None else 0,
            lr=opt.lr,
            weight_decay=opt.weight_decay,
            eps=getattr(opt, "eps", 0.0),
            beta1=opt.betas[0] if isinstance(opt, LazyAdam) else 0.0,
            beta2=opt.betas[1] if isinstance(opt, LazyAdam) else 0.0,
            alpha=opt.alpha if isinstance(opt, RMSProp) else 0.0,
            stream=stream,
        )
        comm.barrier()  # updates are visible before anyone reads rows again

    def save(self, directory: str | os.PathLike[str], *, num_parts: int | None = None) -> None:
        """Collective: store the table and the optimizer state (any number of parts).

        Parameters
        ----------
        directory : path
            The folder to write (created if missing).
        num_parts : int, optional
            Number of files per tensor; one per rank when None.

        Raises
        ------
        OSError
            The files cannot be written.
        ValueError
            ``num_parts`` < 1.
        """
        self._check("Embedding.save")
        local, first = get_local_tensor(self.weight)
        shape = (self.embedding_dim,)
        store_local(
            self.comm,
            self.num_embeddings,
            shape,
            self.weight.dtype,
            local,
            first,
            directory,
            "weight",
            num_parts,
            extra={"step": self._step, "optimizer": repr(self.optimizer)},
        )
        for i, st in enumerate(self._states):
            store_local(self.comm, self.num_embeddings, shape, st.dtype, st, first, directory, f"state{i}", num_parts)
        if self._row_state is not None:
            rs = self._row_state
            store_local(self.comm, self.num_embeddings, (2,), rs.dtype, rs, first, directory, "rowstate", num_parts)

    def load(self, directory: str | os.PathLike[str]) -> None:
        """Collective: load a table (and optimizer state) stored by :meth:`save`.

        Parameters
        ----------
        directory : path
            A folder written by :meth:`save` (with any number of parts).

        Raises
        ------
        ValueError
            The stored table has another shape.
        TypeError
            The stored dtype differs.
        FileNotFoundError
            Files are missing (e.g. no optimizer state stored).
        """
        self._check("Embedding.load")
        local, first = get_local_tensor(self.weight)
        shape = (self.embedding_dim,)
        meta = load_local(self.comm, self.num_embeddings, shape, self.weight.dtype, local, first, directory, "weight")
        for i, st in enumerate(self._states):
            load_local(self.comm, self.num_embeddings, shape, st.dtype, st, first, directory, f"state{i}")
        if self._row_state is not None:
            rs = self._row_state
            load_local(self.comm, self.num_embeddings, (2,), rs.dtype, rs, first, directory, "rowstate")
        self._step = int(meta["step"]) if meta else 0
