"""The MPI point-to-point bound between two hosts: ``MPI_Sendrecv`` of a buffer between 2 ranks, timed.

A benchmark's across-host step cannot beat moving its bytes between two ranks on
different hosts; this measures that bound on the links as they are (shaped or not).
Both ranks send ``--bytes`` to each other at once (``Sendrecv``), ``--warmup`` times
untimed, then ``--iters`` times behind a barrier; an iteration lasts as long as its
slower rank. Rank 0 prints one line, :data:`MARKER` and a JSON object::

    DISTKIT_P2P {"bytes": 67108864, "iters": 5, "hosts": ["dkh1", "dkh2"], "seconds": [...],
                 "best_s": ..., "median_s": ..., "bytes_per_s": ...}

``bytes_per_s`` is ``bytes / median_s``, in each direction. The received buffers are
compared with what the peer sent (exit 1 if they differ). Run it on 2 ranks, one per host::

    ci/cluster/up 2 --rate 1gbit
    ci/cluster/mpiexec --host dkh1:1,dkh2:1 -n 2 python packages/common/src/distkit_common/testing/mpi_p2p.py --bytes 64MiB

or from Python with :func:`distkit_common.testing.measure_mpi_sendrecv`. Only the
standard library, numpy and mpi4py are imported (it runs as a file).
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import sys
from collections.abc import Sequence
from typing import Any

#: the prefix of the result line rank 0 prints
MARKER = "DISTKIT_P2P "
#: the largest buffer it exchanges (MPI's int count of bytes)
MAX_BYTES = 2**31 - 1
MAX_ITERS = 1000
_SIZE_RE = re.compile(r"^([0-9]+)(|KiB|MiB|GiB)$")
_SIZE_UNITS = {"": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def parse_size(text: str) -> int:
    """Read a size in bytes from ``"4096"``, ``"64KiB"``, ``"16MiB"`` or ``"1GiB"``.

    Parameters
    ----------
    text : str
        An integer and an optional binary unit.

    Returns
    -------
    int
        The size in bytes.

    Raises
    ------
    ValueError
        If ``text`` is not such a size, or outside ``[1, MAX_BYTES]``.
    """
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise ValueError(f"size {text!r} is not an integer with an optional unit KiB, MiB or GiB")
    n = int(m.group(1)) * _SIZE_UNITS[m.group(2)]
    if not 1 <= n <= MAX_BYTES:
        raise ValueError(f"size {text!r} = {n} bytes is out of range [1, {MAX_BYTES}]")
    return n


def parse_result(stdout: str) -> dict[str, Any]:
    """Return the result object of the line that starts with :data:`MARKER` in a job's output.

    Parameters
    ----------
    stdout : str
        The job's output.

    Returns
    -------
    dict
        The JSON object of that line.

    Raises
    ------
    ValueError
        If there is no such line (or more than one).
    """
    lines = [line[len(MARKER) :] for line in stdout.splitlines() if line.startswith(MARKER)]
    if len(lines) != 1:
        raise ValueError(f"expected one {MARKER.strip()} line in the output, found {len(lines)}")
    result: dict[str, Any] = json.loads(lines[0])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement on this rank (the command line; see the module docstring).

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments; ``sys.argv[1:]`` when None.

    Returns
    -------
    int
        The exit code: 0; 1 if the received buffers differ from what the peer sent; 2 if
        the job is not 2 ranks on 2 hosts.
    """
    parser = argparse.ArgumentParser(description="MPI_Sendrecv of a buffer between 2 ranks, timed (one per host).")
    parser.add_argument("--bytes", type=parse_size, default=64 * 2**20, help="buffer size (default 64MiB)")
    parser.add_argument("--iters", type=int, default=5, help=f"timed exchanges, [1, {MAX_ITERS}] (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed exchanges first (default 1)")
    parser.add_argument("--one-way", action="store_true", help="rank 0 sends, rank 1 receives (Send / Recv)")
    parser.add_argument("--allow-same-host", action="store_true", help="also run when both ranks share a host")
    a = parser.parse_args(argv)
    if not 1 <= a.iters <= MAX_ITERS or not 0 <= a.warmup <= MAX_ITERS:
        parser.error(f"--iters must be in [1, {MAX_ITERS}] and --warmup in [0, {MAX_ITERS}]")

    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.size != 2:
        if comm.rank == 0:
            print(f"mpi_p2p: needs exactly 2 ranks, got {comm.size}", file=sys.stderr)
        return 2
    rank, peer = comm.rank, 1 - comm.rank
    hosts = comm.allgather(socket.gethostname())
    if hosts[0] == hosts[1] and not a.allow_same_host:
        if rank == 0:
            print(f"mpi_p2p: both ranks run on {hosts[0]}; place them on two hosts", file=sys.stderr)
        return 2

    def pattern(r: int) -> np.ndarray:
        return np.resize(((np.arange(251) * (r + 3)) % 251).astype(np.uint8), a.bytes)

    send, recv = pattern(rank), np.zeros(a.bytes, dtype=np.uint8)
    times: list[float] = []
    for i in range(a.warmup + a.iters):
        comm.Barrier()
        t0 = MPI.Wtime()
        if not a.one_way:
            comm.Sendrecv(send, dest=peer, recvbuf=recv, source=peer)
        elif rank == 0:
            comm.Send(send, dest=peer)
        else:
            comm.Recv(recv, source=peer)
        dt = comm.allreduce(MPI.Wtime() - t0, op=MPI.MAX)
        if i >= a.warmup:
            times.append(dt)
    same = comm.allreduce(bool((a.one_way and rank == 0) or np.array_equal(recv, pattern(peer))), op=MPI.LAND)
    if not same:
        if rank == 0:
            print("mpi_p2p: a received buffer differs from what its peer sent", file=sys.stderr)
        return 1
    if rank == 0:
        median = statistics.median(times)
        result = {
            "bytes": a.bytes,
            "one_way": a.one_way,
            "iters": a.iters,
            "hosts": hosts,
            "seconds": times,
            "best_s": min(times),
            "median_s": median,
            "bytes_per_s": a.bytes / median,
        }
        print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
