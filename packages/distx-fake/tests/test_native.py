"""The native module: crc32c (hardware and software), parallel pwrite/pread, mt19937 skipping."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import distkit_common
import distx_fake
from distx_fake import _distx_fake as nat


def test_native_version_matches_package() -> None:
    assert nat.version() == distx_fake.__version__ == distkit_common.__version__


def test_thread_pool_is_available() -> None:
    assert nat.get_num_threads() >= 1


def test_crc32c_known_vectors() -> None:
    # RFC 3720 / iSCSI check values
    assert nat.crc32c(b"123456789") == 0xE3069283
    assert nat.crc32c(b"123456789", software=True) == 0xE3069283
    assert nat.crc32c(bytes(32)) == 0x8A9136AA
    assert nat.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert nat.crc32c(b"") == 0


def test_crc32c_hw_equals_sw_and_chains() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 7, 8, 9, 63, 4096, 24_575, 24_576, 100_003, (1 << 20) + 5):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        for off in (0, 1, 3):  # unaligned starts
            d = data[off:]
            assert nat.crc32c(d) == nat.crc32c(d, software=True)
        half = n // 2
        assert nat.crc32c(data[half:], nat.crc32c(data[:half])) == nat.crc32c(data)


def test_write_read_pieces_roundtrip(tmp_path: Path) -> None:
    src = torch.arange(1 << 20, dtype=torch.int32)
    nbytes = src.numel() * 4
    pieces = [(src.data_ptr() + o, min(65536, nbytes - o), 8192 + o) for o in range(0, nbytes, 65536)]
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        crcs = nat.write_pieces(fd, pieces)
        nat.fsync_fd(fd)
        dst = torch.zeros_like(src)
        back = nat.read_pieces(fd, [(dst.data_ptr() + (p[0] - src.data_ptr()), p[1], p[2]) for p in pieces])
    finally:
        os.close(fd)
    assert crcs == back
    assert torch.equal(src, dst)
    raw = (tmp_path / "f.bin").read_bytes()
    assert nat.crc32c(raw[8192 : 8192 + 65536]) == crcs[0]
    nat.fsync_path(str(tmp_path))


def test_native_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="length must be >= 0"):
        nat.write_pieces(1, [(0, -1, 0)])
    with pytest.raises(ValueError, match="null pointer"):
        nat.read_pieces(0, [(0, 10, 0)])
    fd = os.open(tmp_path / "short.bin", os.O_RDWR | os.O_CREAT, 0o600)
    buf = torch.zeros(16, dtype=torch.uint8)
    try:
        with pytest.raises(ValueError, match="truncated"):
            nat.read_pieces(fd, [(buf.data_ptr(), 16, 0)])
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        nat.write_pieces(-1, [(buf.data_ptr(), 16, 0)])
    with pytest.raises(OSError):
        nat.fsync_path(str(tmp_path / "missing"))
    with pytest.raises(OSError, match="fstat"):
        nat.cached_fraction(-1)
    st = torch.zeros(10, dtype=torch.uint8)
    with pytest.raises(ValueError, match="5056 bytes"):
        nat.mt19937_advance(st.data_ptr(), st.numel(), 1)


def test_cached_fraction_follows_the_page_cache(tmp_path: Path) -> None:
    f = tmp_path / "c.bin"
    f.write_bytes(os.urandom(4 << 20))  # just written: in the page cache
    fd = os.open(f, os.O_RDONLY)
    try:
        assert nat.cached_fraction(fd) == 1.0
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        cold = nat.cached_fraction(fd)
        assert cold < 0.5  # evicted (a page or two may come back through readahead of others)
        os.pread(fd, 2 << 20, 0)  # read the first half through the cache
        assert 0.45 <= nat.cached_fraction(fd) <= 1.0
        assert nat.cached_fraction(fd) > cold
    finally:
        os.close(fd)
    (tmp_path / "empty.bin").write_bytes(b"")
    fd = os.open(tmp_path / "empty.bin", os.O_RDONLY)
    try:
        assert nat.cached_fraction(fd) == 0.0
    finally:
        os.close(fd)


def test_mt19937_advance_matches_raw_draws() -> None:
    # uniform_ on float32 consumes exactly one 32-bit draw per element
    for n in (1, 623, 624, 625, 5000):
        g = torch.Generator().manual_seed(11)
        st = g.get_state()
        nat.mt19937_advance(st.data_ptr(), st.numel(), n)
        torch.empty(n).uniform_(generator=g)
        assert torch.equal(st, g.get_state())


def test_direct_io_roundtrip_aligned_and_bounced(tmp_path: Path) -> None:
    path = tmp_path / "d.bin"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        pytest.skip("filesystem without O_DIRECT")
    raw = torch.randint(0, 256, ((3 << 20) + 8192,), dtype=torch.uint8)
    shift = (-raw.data_ptr()) % nat.DIRECT_ALIGN
    aligned = raw[shift : shift + (2 << 20)]  # 4 KiB-aligned pointer and length: no bounce copy
    odd = raw[shift + 1 : shift + 1 + 12345]  # unaligned pointer and length: bounce buffer + padding
    assert aligned.data_ptr() % nat.DIRECT_ALIGN == 0
    try:
        crcs = nat.write_pieces(
            fd, [(aligned.data_ptr(), aligned.numel(), 0), (odd.data_ptr(), odd.numel(), 2 << 20)], True
        )
        a2, o2 = torch.zeros_like(aligned), torch.zeros(12345, dtype=torch.uint8)
        back = nat.read_pieces(fd, [(a2.data_ptr(), a2.numel(), 0), (o2.data_ptr(), 12345, 2 << 20)], True)
        with pytest.raises(ValueError, match="must not share 4096-byte file blocks"):
            nat.write_pieces(fd, [(o2.data_ptr(), 10, 100), (o2.data_ptr(), 10, 200)], True)
    finally:
        os.close(fd)
    assert crcs == back == [nat.crc32c(aligned.numpy().tobytes()), nat.crc32c(odd.numpy().tobytes())]
    assert torch.equal(a2, aligned) and torch.equal(o2, odd)


def test_direct_io_unaligned_offsets_and_residues(tmp_path: Path) -> None:
    """Direct I/O at any file offset: zero-copy when address and offset agree modulo 4096
    (the checkpoint layout), bounced otherwise; bytes around a piece in its blocks are zero."""
    path = tmp_path / "u.bin"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        pytest.skip("filesystem without O_DIRECT")
    A = nat.DIRECT_ALIGN
    raw = torch.randint(0, 256, ((9 << 20) + 3 * A,), dtype=torch.uint8)
    base = raw.data_ptr()
    r = base % A
    n1 = (9 << 20) + 1000  # > one 8 MiB I/O block, partial first and last blocks
    # piece 1: offset with the same residue as its address -> whole blocks straight from memory
    # piece 2: residue differs -> bounced; piece 3: shorter than a block, inside one block
    off1 = 3 * A + r
    off2 = -(-(off1 + n1) // A) * A + 17
    off3 = -(-(off2 + 5000) // A) * A + 100
    # (+ an empty piece inside piece 1's first block: writes nothing, zeroes nothing)
    pieces = [(base, n1, off1), (base + 1, 5000, off2), (base + 3, 7, off3), (base, 0, off1 + 8)]
    try:
        crcs = nat.write_pieces(fd, pieces, True)
        nat.fsync_fd(fd)
        dst = torch.zeros(n1 + 2 * A, dtype=torch.uint8)
        d = dst.data_ptr()
        # read back into the same residue (zero-copy), a different one, and through buffered I/O
        d_same = d + ((r - d) % A)
        back = nat.read_pieces(fd, [(d_same, n1, off1)], True)
        got1 = dst[d_same - d : d_same - d + n1].clone()
        back2 = nat.read_pieces(fd, [(d + 1, 5000, off2), (d + 6000, 7, off3)], True)
        got2, got3 = dst[1:5001].clone(), dst[6000:6007].clone()
    finally:
        os.close(fd)
    expect = [nat.crc32c(raw[:n1].numpy().tobytes()), nat.crc32c(raw[1:5001].numpy().tobytes())]
    expect.append(nat.crc32c(raw[3:10].numpy().tobytes()))
    assert crcs == [*expect, 0] and back == expect[:1] and back2 == expect[1:]
    assert torch.equal(got1, raw[:n1]) and torch.equal(got2, raw[1:5001]) and torch.equal(got3, raw[3:10])
    data = path.read_bytes()
    assert data[off1 : off1 + n1] == raw[:n1].numpy().tobytes()
    assert data[3 * A : off1] == bytes(r)  # zero padding before the first byte
    assert data[off2 - 17 : off2] == bytes(17) and data[off3 - 100 : off3] == bytes(100)
    assert len(data) % A == 0


@pytest.mark.parametrize("direct", [False, True])
def test_copy_pieces_scatters_each_piece_to_its_runs_with_its_crc(tmp_path: Path, direct: bool) -> None:
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, 20 << 20, dtype=np.uint8).tobytes()  # > one read block
    (tmp_path / "src.bin").write_bytes(data)
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    try:
        src = os.open(tmp_path / "src.bin", flags)
    except OSError:
        pytest.skip("O_DIRECT is not supported on this filesystem")
    dsts = [os.open(tmp_path / f"d{i}.bin", os.O_RDWR | os.O_CREAT, 0o600) for i in range(2)]
    # pieces at unaligned offsets (O_DIRECT reads the aligned blocks around them), one empty
    pieces = [(0, 64, (9 << 20) + 7), (0, 4096 + 64, 5), (0, 0, 0), (0, 3, 1000)]
    runs, expect = [], {0: bytearray(), 1: bytearray()}
    for k, (_, off, n) in enumerate(pieces):
        # split each piece into uneven runs, the pieces alternating between the two files
        cuts = sorted({0, n, *rng.integers(0, max(n, 1), 5).tolist()})
        d = k % 2
        for a, b in itertools.pairwise(cuts):
            runs.append((k, a, b - a, d, len(expect[d])))
            expect[d] += data[off + a : off + b]
    rng.shuffle(runs)  # the engine orders them
    try:
        crcs = nat.copy_pieces([(src, direct)], dsts, pieces, runs, writeback=direct)
    finally:
        os.close(src)
        for fd in dsts:
            os.close(fd)
    assert crcs == [nat.crc32c(data[off : off + n]) for _, off, n in pieces]
    for d in range(2):
        assert (tmp_path / f"d{d}.bin").read_bytes() == bytes(expect[d])
    with pytest.raises(ValueError, match="invalid run"):
        nat.copy_pieces([(0, False)], [1], [(0, 0, 10)], [(0, 5, 10, 0, 0)])  # past the piece's end
    with pytest.raises(ValueError, match="invalid source piece"):
        nat.copy_pieces([(0, False)], [1], [(3, 0, 10)], [])
    with pytest.raises(ValueError, match="go to several destination files"):
        nat.copy_pieces([(0, False)], [1, 2], [(0, 0, 10)], [(0, 0, 5, 0, 0), (0, 5, 5, 1, 0)])


def test_copy_pieces_errors_end_the_copy_cleanly(tmp_path: Path) -> None:
    data = bytes(range(256)) * (40 << 12)  # 10 MiB: several blocks per piece
    (tmp_path / "src.bin").write_bytes(data)
    src = os.open(tmp_path / "src.bin", os.O_RDONLY)
    ro = os.open(tmp_path / "src.bin", os.O_RDONLY)  # not writable: the writer fails
    dst = os.open(tmp_path / "dst.bin", os.O_RDWR | os.O_CREAT, 0o600)
    pieces = [(0, o, 1 << 20) for o in range(0, len(data), 1 << 20)]
    runs = [(k, 0, 1 << 20, 0, k << 20) for k in range(len(pieces))]
    try:
        with pytest.raises(OSError, match="pwrite"):
            nat.copy_pieces([(src, False)], [ro], pieces, runs)
        with pytest.raises(ValueError, match="truncated"):  # a piece past the end of the source
            nat.copy_pieces([(src, False)], [dst], [*pieces, (0, len(data) - 10, 20)], runs)
        # and the engine still works afterwards
        assert nat.copy_pieces([(src, False)], [dst], pieces, runs) == [
            nat.crc32c(data[o : o + (1 << 20)]) for _, o, _ in pieces
        ]
    finally:
        for fd in (src, ro, dst):
            os.close(fd)
    assert (tmp_path / "dst.bin").read_bytes() == data
