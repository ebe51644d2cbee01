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
    ("args", "messages"),
    [
        # every problem of one command line is reported at once (one launch of 4 ranks per case)
        (
            ["--tp", "3", "--steps", "0", "--resume"],
            ["--tp 3 does not divide the 4 ranks", "--steps must be >= 1", "--resume: no checkpoint"],
        ),
        (["--items", "255"], ["--items 255 is not divisible by --tp 2"]),
    ],
)
def test_bad_configuration_is_refused(tmp_path: Path, recsys, args: list[str], messages: list[str]) -> None:
    res = run_mpi(recsys.job, 4, args=[*recsys.small, "--out", str(tmp_path), *args], timeout=300, check=False)
    assert res.returncode != 0
    for message in messages:
        assert message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
