"""The prefetching iterator of the torch modules: intent for each batch, a few batches early."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from distkit_common.validate import check_int

from ._worker import Worker


def prefetch(
    worker: Worker,
    batches: Iterable[Any],
    ahead: Any,
    keys_of: Callable[[Any], torch.Tensor],
    flush: Callable[[], None],
) -> Iterator[Any]:
    """Yield ``batches``; signal intent for batch ``i``'s keys ``ahead`` batches before it.

    Batch ``i`` is used at clock ``c0 + i`` (``c0``: the worker's clock at the
    start). After each batch the module's pushes are waited for (``flush``)
    and the worker's clock advances by one. ``keys_of(batch)`` returns the
    batch's server keys (int64, 1-D).

    Raises
    ------
    TypeError, ValueError
        ``ahead`` is not an int >= 0.
    """
    n_ahead = check_int(ahead, "ahead", lo=0)
    it = iter(batches)
    queue: deque[Any] = deque()
    nxt = worker.current_clock()

    def take() -> bool:
        nonlocal nxt
        try:
            b = next(it)
        except StopIteration:
            return False
        worker.intent(torch.unique(keys_of(b)), nxt)
        nxt += 1
        queue.append(b)
        return True

    for _ in range(n_ahead + 1):
        if not take():
            break
    while queue:
        yield queue.popleft()
        flush()
        worker.advance_clock()
        take()


def default_ids(batch: Any) -> Any:
    """The ids of a batch: the batch itself, or its first element."""
    if isinstance(batch, (tuple, list)) and batch:
        return batch[0]
    return batch
