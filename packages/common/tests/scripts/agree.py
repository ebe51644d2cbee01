"""Helper job for test_boundary: failure agreement and JSON exchange over mpi4py on every rank."""

import sys
from collections.abc import Callable

from mpi4py import MPI

from distkit_common import collective

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def caught(body: Callable[[], None]) -> BaseException:
    """The exception ``body`` raises (the job fails if it raises none)."""
    try:
        body()
    except Exception as e:
        return e
    sys.exit(f"rank {rank}: nothing raised")


# JSON exchange: every rank's object, in rank order; a broadcast from the last rank
got = collective.allgather_json({"rank": rank, "name": "r" * rank}, comm)
assert got == [{"rank": r, "name": "r" * r} for r in range(size)], got
root_obj = [size - 1, "root"] if rank == size - 1 else None
assert collective.bcast_json(root_obj, comm, root=size - 1) == [size - 1, "root"]

# nobody fails: nothing raised
with collective.all_ranks(comm, "quiet step"):
    pass


# rank 1 fails with a ValueError: it re-raises its own, every other rank raises a
# CollectiveError that is also a ValueError and names rank 1 and its message
def step_one() -> None:
    with collective.all_ranks(comm, "step one"):
        if rank == 1:
            raise ValueError("bad shape on rank 1")


e = caught(step_one)
if rank == 1:
    assert type(e) is ValueError and str(e) == "bad shape on rank 1", repr(e)
else:
    assert isinstance(e, ValueError) and isinstance(e, collective.CollectiveError), repr(e)
    assert e.step == "step one" and list(e.failures) == [1], e.failures
    assert str(e) == "step one failed on rank 1: ValueError: bad shape on rank 1", str(e)

# two ranks fail with different types: the lowest failing rank's type decides elsewhere
if size >= 3:
    err = OSError(28, "No space left on device") if rank == 2 else (KeyError("k") if rank == 1 else None)
    e = caught(lambda: collective.agree(comm, "step two", err))
    if rank in (1, 2):
        assert e is err, repr(e)
        other = 2 if rank == 1 else 1
        assert f"step two also failed on rank(s) {other}" in getattr(e, "__notes__", []), repr(e)
    else:
        assert isinstance(e, KeyError) and isinstance(e, collective.CollectiveError), repr(e)
        assert sorted(e.failures) == [1, 2] and e.failures[2].builtin == "OSError", e.failures
        assert "(and on rank 2)" in str(e), str(e)

comm.Barrier()
print(f"rank {rank} ok", flush=True)
