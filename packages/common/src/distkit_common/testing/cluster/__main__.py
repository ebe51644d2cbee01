from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

if not __package__:  # run as a file from a source checkout (ci/cluster/*), not with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from distkit_common.rates import format_rate
from distkit_common.testing.cluster._hosts import (
    BRIDGE,
    ClusterError,
    _ip,
    exec_prefix,
    host_pids,
    resolve_host,
    unavailable_reason,
)
from distkit_common.testing.cluster._lifecycle import (
    _line_of,
    current,
    down,
    job_env,
    leftovers,
    up,
)
from distkit_common.testing.cluster._measure import MEASURE_SECONDS, measure_tcp
from distkit_common.testing.cluster._session import _cli_lock, _reap
from distkit_common.testing.cluster._shaping import link_rates

# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="cluster", description="The distkit simulated cluster (network namespaces).")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="bring up hosts dkh1..dkhN (idempotent)")
    p_up.add_argument("n", type=int)
    p_up.add_argument("--rate", help="shape every host's link to this rate, both directions (tc syntax: 1gbit)")
    sub.add_parser("down", help="remove everything `up` made (idempotent)")
    sub.add_parser("status", help="hosts, addresses, links and processes")
    sub.add_parser("check", help="say whether this machine can host the cluster")
    sub.add_parser("env", help="print the settings of a job across the hosts, as shell `export` lines")
    p_measure = sub.add_parser("measure", help="goodput of one TCP stream from one host to another")
    p_measure.add_argument("src")
    p_measure.add_argument("dst")
    p_measure.add_argument("--seconds", type=float, default=MEASURE_SECONDS)
    p_exec = sub.add_parser("exec", help="run a command on a host")
    p_exec.add_argument("host")
    p_exec.add_argument("command", nargs=argparse.REMAINDER)
    p_reap = sub.add_parser("_reap")
    p_reap.add_argument("fd", type=int)
    a = parser.parse_args(argv)
    try:
        if a.cmd == "_reap":
            return _reap(a.fd)
        if a.cmd == "check":
            reason = unavailable_reason()
            print(
                f"simulated cluster unavailable: {reason}" if reason else "this machine can host the simulated cluster"
            )
            return 1 if reason else 0
        if a.cmd == "env":
            for key, value in job_env().items():
                print(f"export {key}={shlex.quote(value)}")
            return 0
        if a.cmd == "up":
            fd = _cli_lock()  # refuse while a test session holds the cluster
            try:
                c = up(a.n, a.rate)
            finally:
                os.close(fd)
            for h in c.hosts:
                print(f"{h.name}\t{h.address}\tlink {h.link}")
            if c.rate is not None:
                print(f"every link shaped to {format_rate(c.rate)} in both directions")
            return 0
        if a.cmd == "measure":
            fd = _cli_lock()  # never disturb a test session's cluster
            try:
                bps = measure_tcp(a.src, a.dst, seconds=a.seconds)
            finally:
                os.close(fd)
            print(f"{resolve_host(a.src).name} -> {resolve_host(a.dst).name}: {bps * 8 / 1e6:.1f} Mbit/s TCP goodput")
            return 0
        if a.cmd == "down":
            fd = _cli_lock()
            try:
                for item in down():
                    print(f"removed {item}")
            finally:
                os.close(fd)
            return 0
        if a.cmd == "status":
            now = current()
            if now is None:
                left = leftovers()
                print("no simulated cluster" + (f" (leftovers: {', '.join(left)})" if left else ""))
                return 0
            links = _ip("-o", "link", "show", "master", BRIDGE, check=False).stdout
            for h in now.hosts:
                state = "DOWN" if "state DOWN" in _line_of(links, h.link) else "up"
                rates = "/".join("unshaped" if r is None else format_rate(r) for r in link_rates(h))
                shaped = "unshaped" if rates == "unshaped/unshaped" else f"in/out {rates}"
                print(f"{h.name}\t{h.address}\tlink {h.link} {state}\tprocesses {len(host_pids(h))}\t{shaped}")
            if now.rate is not None:
                print(f"links: shaped to {format_rate(now.rate)} in both directions")
            elif any(r is not None for h in now.hosts for r in link_rates(h)):
                print("links: shaped unevenly (`up N --rate R` re-shapes them)")
            else:
                print("links: unshaped")
            return 0
        if a.cmd == "exec":
            if not a.command:
                parser.error("exec needs a command")
            return subprocess.call([*exec_prefix(a.host), *a.command])
    except (ClusterError, ValueError, TypeError) as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
