"""One TCP stream's goodput from one simulated host to another (:func:`measure_tcp`)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time

from ._hosts import ClusterError, Host, exec_prefix, resolve_host
from ._lifecycle import current

MEASURE_SECONDS = 2.0
MEASURE_MAX_SECONDS = 60.0
#: the receiving end: listen on the host's address, count the bytes from the first to the last
_RECEIVER = """
import socket, sys, time
s = socket.create_server((sys.argv[1], 0))
s.settimeout(float(sys.argv[2]))
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.settimeout(float(sys.argv[2]))
buf = bytearray(1 << 22)
first = c.recv_into(buf)
t0 = time.perf_counter()
n = 0
while first:
    k = c.recv_into(buf)
    if not k:
        break
    n += k
t1 = time.perf_counter()
c.close()
print(n, t1 - t0, flush=True)
"""
#: the sending end: send zeros for a while (or a number of bytes), then close and wait for the receiver
_SENDER = """
import socket, sys, time
addr, port, seconds, nbytes, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
c = socket.create_connection((addr, port), timeout=timeout)
buf = memoryview(bytes(1 << 20))
end = time.monotonic() + seconds
sent = 0
while sent < nbytes and time.monotonic() < end:
    k = min(len(buf), nbytes - sent)
    c.sendall(buf[:k])
    sent += k
c.shutdown(socket.SHUT_WR)
c.recv(1)
"""


def measure_tcp(
    src: Host | str | int,
    dst: Host | str | int,
    *,
    seconds: float = MEASURE_SECONDS,
    nbytes: int | None = None,
    timeout: float | None = None,
) -> float:
    """Goodput in bytes/s of one TCP stream from host ``src`` to host ``dst`` of the cluster that is up.

    A Python receiver on ``dst`` listens on its cluster address; a Python
    sender on ``src`` sends for ``seconds`` (or ``nbytes``, whichever ends
    first) and closes. The receiver counts the payload from its first read to
    the end of the stream. Both run through :func:`exec_prefix` and are
    killed and reaped on a timeout. On a shaped link expect about 95.6 % of
    the rate: tbf counts every frame's Ethernet, IP and TCP headers (1514
    bytes on the link carry 1448 of payload, with TCP timestamps).

    Parameters
    ----------
    src, dst : Host, str or int
        Two different hosts of the cluster that is up.
    seconds : float
        How long the sender sends, ``(0, MEASURE_MAX_SECONDS]``.
    nbytes : int, optional
        Stop after this many bytes instead, if sooner.
    timeout : float, optional
        Seconds before both ends are killed and the call fails (default ``seconds + 30``;
        below ``seconds`` it always cuts the stream off).

    Returns
    -------
    float
        Payload bytes per second received.

    Raises
    ------
    TypeError, ValueError
        On bad hosts, ``seconds``, ``nbytes`` or ``timeout``.
    ClusterError
        If a host is not up, or the stream fails or times out.
    """
    s, d = resolve_host(src), resolve_host(dst)
    if s == d:
        raise ValueError(f"src and dst are the same host {s.name}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"seconds must be a number, got {type(seconds).__name__}")
    if not 0 < seconds <= MEASURE_MAX_SECONDS:
        raise ValueError(f"seconds = {seconds} is out of range (0, {MEASURE_MAX_SECONDS}]")
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int)):
        raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__}")
    if nbytes is not None and nbytes < 1 << 20:
        raise ValueError(f"nbytes = {nbytes} is below 1 MiB: too short to measure a link")
    if timeout is None:
        timeout = seconds + 30.0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number, got {timeout!r}")
    c = current()
    if c is None or s not in c.hosts or d not in c.hosts:
        raise ClusterError(f"hosts {s.name} and {d.name} are not both up")
    deadline = time.monotonic() + timeout
    procs: list[subprocess.Popen[str]] = []

    def start(h: Host, script: str, *args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [*exec_prefix(h), sys.executable, "-I", "-c", script, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        procs.append(p)
        return p

    try:
        rx = start(d, _RECEIVER, d.address, str(timeout))
        assert rx.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(rx.stdout, selectors.EVENT_READ)
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise ClusterError(f"the receiver on {d.name} did not start within {timeout:.0f}s")
        port = rx.stdout.readline().strip()
        if not port.isdigit():
            raise ClusterError(f"the receiver on {d.name} failed: {rx.communicate(timeout=10)[1].strip()}")
        tx = start(s, _SENDER, d.address, port, str(seconds), str(nbytes or 1 << 62), str(timeout))
        try:
            out, err = rx.communicate(timeout=max(0.0, deadline - time.monotonic()))
            tx_err = tx.communicate(timeout=max(1.0, deadline - time.monotonic()))[1]
        except subprocess.TimeoutExpired:
            raise ClusterError(f"the TCP stream {s.name} -> {d.name} did not end within {timeout:.0f}s") from None
        if rx.returncode != 0 or tx.returncode != 0:
            raise ClusterError(
                f"the TCP stream {s.name} -> {d.name} failed: receiver {rx.returncode} {err.strip()!r}, "
                f"sender {tx.returncode} {tx_err.strip()!r}"
            )
        got, elapsed = out.split()
        if int(got) == 0 or float(elapsed) <= 0:
            raise ClusterError(f"the TCP stream {s.name} -> {d.name} carried too little to measure")
        return int(got) / float(elapsed)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.communicate(timeout=10)
