"""Progress bars for long saves and loads (rank 0 only; by default only on a terminal)."""

from __future__ import annotations

import sys
from typing import Any


def progress(enabled: bool | None, rank: int, total: int, desc: str) -> Any:
    if rank != 0:
        return None
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return TextBar(total, desc)
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr)


class TextBar:
    """Minimal stand-in for tqdm (used when tqdm is not installed)."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.n = max(total, 1), desc, 0
        self._show()

    def _show(self) -> None:
        pct = 100 * self.n // self.total
        sys.stderr.write(f"\r{self.desc}: {pct:3d}% {self.n / 1e6:.1f}/{self.total / 1e6:.1f} MB")
        sys.stderr.flush()

    def update(self, n: int) -> None:
        self.n = min(self.total, self.n + n)
        self._show()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()
