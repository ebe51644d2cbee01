"""Fake tensors (torchdistX ``fake`` API): ``fake_mode``, ``is_fake``, ``meta_like``."""

from __future__ import annotations

from ._fake import FakeDataError, FakeTensor, fake_mode, is_fake, meta_like

__all__ = ["FakeDataError", "FakeTensor", "fake_mode", "is_fake", "meta_like"]
