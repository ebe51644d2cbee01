"""Fake tensors (torchdistX ``fake`` API): ``fake_mode``, ``is_fake``, ``meta_like``."""

from __future__ import annotations

from ._fake import FakeDataError, fake_mode, is_fake, meta_like

__all__ = ["FakeDataError", "fake_mode", "is_fake", "meta_like"]
