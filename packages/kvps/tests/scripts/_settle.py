"""The end of a multi-rank script: let replicas converge, then check that every push counted exactly once."""

from __future__ import annotations

from typing import Any

import numpy as np


def settle_and_check_sums(w: Any, server: Any, comm: Any, pushed: np.ndarray, value_len: int, clocks: int) -> None:
    """Advance ``clocks`` clocks (every intent window ends), run the README's convergence recipe
    (sync round, barrier, sync round, barrier), pull every key and assert it equals the sum over
    ranks of ``pushed`` (the +1 pushes each rank made per key, ``value_len`` values per key)."""
    for _ in range(clocks):
        w.advance_clock()
    w.wait_sync()
    server.barrier()
    w.wait_sync()
    server.barrier()
    total = comm.allreduce(pushed)
    out = np.zeros(len(pushed) * value_len, dtype=np.float32)
    w.wait(w.pull(np.arange(len(pushed), dtype=np.int64), out))
    assert np.array_equal(out, np.repeat(total.astype(np.float32), value_len)), "pushes were lost or doubled"
