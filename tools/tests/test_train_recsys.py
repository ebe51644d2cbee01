"""The composed training job: resume is bit-identical, bad configuration gets a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest

from distkit_common.testing import run_mpi


@pytest.mark.mpi
def test_resumed_run_is_bit_identical(tmp_path: Path, recsys) -> None:
    recsys.check_resume_is_bit_identical(lambda args: run_mpi(recsys.job, 4, args=args, timeout=300), tmp_path)


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "3"], "--tp 3 does not divide the 4 ranks"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--items", "255"], "--items 255 is not divisible by --tp 2"),
        (["--resume"], "--resume: no checkpoint"),
    ],
)
def test_bad_configuration_is_refused(tmp_path: Path, recsys, args: list[str], message: str) -> None:
    res = run_mpi(recsys.job, 4, args=[*recsys.small, "--out", str(tmp_path), *args], timeout=300, check=False)
    assert res.returncode != 0
    assert message in res.stderr
    assert "Traceback" not in res.stderr
