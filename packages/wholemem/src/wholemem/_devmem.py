"""GPU memory shared by the ranks of a node: GPU CHUNKED chunks and DEVICE allocations.

Ownership (see the README's "Memory ownership"):

- A chunk that no other process maps (a one-rank communicator) comes from torch's
  caching allocator: it shows in torch's memory statistics, is reused by torch, and is
  freed with the tensor.
- A chunk other ranks map is exported over CUDA IPC, so it must be a raw ``cudaMalloc``
  (torch's allocator may hand a freed block to another tensor while a peer still maps
  it). CUDA forbids freeing it while a peer still maps it, so every chunk has a
  reference count in a small node-shared memory segment: it starts at the number of
  ranks of the node, every rank drops its hold when its last view of the tensor dies
  (a peer unmaps first), and the owner frees the chunk once the count is zero. An owner
  whose own hold goes last frees at once; otherwise the chunk waits in a "limbo" list
  that the owner's next wholemem call (``create_wm_tensor``, ``barrier``, ``destroy``)
  empties. A tensor deleted on every rank is therefore freed by the next collective
  call, not only at ``comm.destroy()``.
"""

from __future__ import annotations

from typing import Any

import torch

from distkit_common.collective import agree, allgather_json

from . import _gpu
from ._wholemem import Segment, atomic_add_i64

_SLOT = 8  # bytes of one int64 reference count


class _Counts:
    """Node-shared reference counts, one int64 per chunk (owner-only, unlinked after mapping)."""

    def __init__(self, seg: Any) -> None:
        self.seg = seg

    @staticmethod
    def create(nslots: int, holders: int) -> _Counts:
        c = _Counts(Segment.create(nslots * _SLOT))
        torch.frombuffer(c.seg, dtype=torch.int64).fill_(holders)
        return c

    def drop(self, slot: int) -> int:
        """Release one hold of chunk ``slot``; returns the holds left."""
        return int(atomic_add_i64(int(self.seg.address) + slot * _SLOT, -1))

    def value(self, slot: int) -> int:
        return int(atomic_add_i64(int(self.seg.address) + slot * _SLOT, 0))


# Own chunks whose last holder was a peer: (backend, pointer, device, counts, slot).
_LIMBO: list[tuple[_gpu.Backend, int, torch.device, _Counts, int]] = []
_LIVE = [0]  # raw chunks this process allocated and has not freed yet


def _free(be: _gpu.Backend, ptr: int, device: torch.device) -> None:
    be.free(ptr, device)
    _LIVE[0] -= 1


def live_chunks() -> int:
    """Raw (exported) device chunks this process allocated and has not freed yet."""
    return _LIVE[0]


def collect_limbo() -> int:
    """Free every own chunk no rank holds any more; returns how many are still held."""
    keep = []
    for entry in _LIMBO:
        be, ptr, device, counts, slot = entry
        if counts.value(slot) <= 0:
            _free(be, ptr, device)
        else:
            keep.append(entry)
    _LIMBO[:] = keep
    return len(keep)


class OwnChunk:
    """This rank's exported chunk (a raw device allocation), freed when no rank holds it.

    Local views (``get_local_tensor``) keep this object, hence the memory, alive.
    """

    def __init__(self, be: _gpu.Backend, nbytes: int, device: torch.device) -> None:
        self.backend, self.nbytes, self.device = be, nbytes, device
        self.ptr = be.alloc(nbytes, device)
        _LIVE[0] += 1
        self.counts: _Counts | None = None  # None: nobody else maps it (creation failed)
        self.slot = 0

    def __del__(self) -> None:
        ptr, self.ptr = self.ptr, 0
        if not ptr:
            return
        try:
            if self.counts is None or self.counts.drop(self.slot) <= 0:
                _free(self.backend, ptr, self.device)
            else:
                _LIMBO.append((self.backend, ptr, self.device, self.counts, self.slot))
        except Exception:  # never raise from a finalizer (e.g. at exit)
            pass


class PeerChunk:
    """A peer's chunk mapped into this process for this rank's GPU."""

    def __init__(self, be: _gpu.Backend, handle: bytes, device: torch.device) -> None:
        self.backend, self.device = be, device
        self.ptr = be.ipc_open(handle, device)
        self.counts: _Counts | None = None
        self.slot = 0

    def release(self) -> None:
        """Unmap (the caller has synchronised the device) and drop this rank's hold."""
        ptr, self.ptr = self.ptr, 0
        if not ptr:
            return
        try:
            self.backend.ipc_close(ptr, self.device)
        finally:
            if self.counts is not None:
                self.counts.drop(self.slot)


class NodeChunks:
    """The device chunks of one GPU CHUNKED / DEVICE tensor as this rank sees them.

    Shared by the tensor, its views and its row table; :meth:`close` (when the last of
    them dies, or at ``comm.destroy()`` / ``finalize_lib``) unmaps the peers' chunks.
    """

    def __init__(self, be: _gpu.Backend, device: torch.device, nbytes: int) -> None:
        self.backend, self.device, self.nbytes = be, device, nbytes
        self.addresses: list[int] = []  #: chunk base addresses in rank order, as this rank's GPU sees them
        self.own: Any = None  #: OwnChunk, or a torch tensor when nothing is exported
        self.peers: list[PeerChunk] = []
        self.closed = False

    def close(self) -> None:
        """Unmap the peers' chunks and drop this rank's holds (idempotent)."""
        if self.closed:
            return
        self.closed = True
        errors = []
        if self.peers:
            try:
                self.backend.synchronize(self.device)  # no kernel of this rank still reads them
            except Exception as e:  # still drop the holds
                errors.append(e)
        for p in self.peers:
            try:
                p.release()
            except Exception as e:  # release every mapping, report the first failure
                errors.append(e)
        self.peers = []
        self.own = None
        if errors:
            raise errors[0]

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # never raise from a finalizer
            pass

    def chunk_bytes(self, i: int, nbytes: int) -> torch.Tensor:
        """Chunk ``i`` as a uint8 tensor on this rank's GPU (keeps the chunk alive)."""
        if isinstance(self.own, torch.Tensor) and i == 0:
            return self.own[:nbytes]
        owner = self.own if isinstance(self.own, OwnChunk) and self.own.ptr == self.addresses[i] else self
        return self.backend.as_tensor(self.addresses[i], nbytes, self.device, owner)


def share(comm: Any, nbytes: int, device: torch.device, owners: list[int], step: str) -> NodeChunks:
    """Collective: ranks ``owners`` allocate ``nbytes`` on their GPU; every rank of the node
    maps every chunk (a one-rank communicator uses torch's allocator and maps nothing).

    Raises
    ------
    RuntimeError, OSError, ValueError
        A CUDA or shared-memory failure on any rank (raised on every rank; nothing leaks).
    """
    be = _gpu.backend()
    _gpu.note_used(device, be)
    collect_limbo()
    chunks = NodeChunks(be, device, nbytes)
    if comm.size == 1:
        err: BaseException | None = None
        try:
            chunks.own = torch.zeros(nbytes, dtype=torch.uint8, device=device)
            chunks.addresses = [int(chunks.own.data_ptr())]
        except (RuntimeError, ValueError) as e:  # out of memory
            err = e
        agree(comm, step, err)
        return chunks
    own: OwnChunk | None = None
    counts: _Counts | None = None
    mine: dict[str, Any] = {}
    err = None
    try:
        if comm.rank in owners:
            own = OwnChunk(be, nbytes, device)
            mine["handle"] = be.ipc_export(own.ptr).hex()
        if comm.local_rank == 0:
            counts = _Counts.create(len(owners), comm.local_size)
            mine["counts"] = counts.seg.name
    except (OSError, RuntimeError, ValueError) as e:
        err = e
    try:
        agree(comm, step, err)  # on failure own is freed with this frame: nobody mapped it
        published = allgather_json(mine, comm)
        _map_peers(comm, chunks, own, owners, published, be, device, step)
    finally:
        if comm.local_rank == 0 and counts is not None:
            counts.seg.unlink()  # every rank has mapped it, or the creation failed everywhere
    return chunks


def _map_peers(
    comm: Any,
    chunks: NodeChunks,
    own: OwnChunk | None,
    owners: list[int],
    published: list[dict[str, Any]],
    be: _gpu.Backend,
    device: torch.device,
    step: str,
) -> None:
    """Collective second half of :func:`share`: map every peer's chunk and attach the counts."""
    err: BaseException | None = None
    counts: _Counts | None = None
    peers: list[PeerChunk] = []
    try:
        counts = _Counts(Segment.open(published[comm.node_ranks[0]]["counts"], len(owners) * _SLOT))
        for r in owners:
            if r == comm.rank:
                assert own is not None
                chunks.addresses.append(own.ptr)
            else:
                p = PeerChunk(be, bytes.fromhex(published[r]["handle"]), device)
                peers.append(p)
                chunks.addresses.append(p.ptr)
    except (OSError, RuntimeError, ValueError) as e:
        err = e
    try:
        agree(comm, step, err)
    except BaseException:
        # nobody holds a count yet: unmap what was mapped, wait for everyone, then own
        # chunks are freed directly (their counts stay unattached)
        be.synchronize(device)
        for p in peers:
            p.release()
        comm.barrier()
        raise
    assert counts is not None
    for slot, r in enumerate(owners):
        if r == comm.rank:
            assert own is not None
            own.counts, own.slot = counts, slot
        else:
            p = peers[[q for q in owners if q != comm.rank].index(r)]
            p.counts, p.slot = counts, slot
    chunks.own, chunks.peers = own, peers
