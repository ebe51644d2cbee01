"""Run a rank's worker threads, re-raising the first error of any of them in the caller."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_threads(fn: Callable[[int], None], n: int) -> None:
    """Run ``fn(0) .. fn(n - 1)`` in ``n`` threads, wait for all, then raise the first error any raised."""
    errors: list[BaseException] = []

    def body(t: int) -> None:
        try:
            fn(t)
        except BaseException as e:  # re-raised in the calling thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
