"""Plan-based tensor parallelism: ``parallelize_module`` and ready plans."""

from __future__ import annotations

from ._apply import parallelize_module
from ._llama import llama_plan
from ._styles import STYLES

__all__ = ["STYLES", "llama_plan", "parallelize_module"]
