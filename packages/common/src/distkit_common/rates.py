"""Link rates in tc's syntax (``"1gbit"``, ``"100mbit"``, ``"125MBps"``) <-> bits per second.

Used wherever a user names a link's speed: kvps's ``KVPS_LINK_RATE`` and the
simulated cluster's shaped links (:mod:`distkit_common.testing.cluster`). Only the
standard library is used.
"""

from __future__ import annotations

import re

#: tc's rate units (iproute2's ``get_rate64``, case-insensitive): bits per second, or bytes
#: per second for the ``...bps`` ones, with decimal (k, m, g, t) or binary (ki, mi, gi, ti) prefixes
RATE_UNITS: dict[str, int] = {
    **{f"{p}bit": m for p, m in (("", 1), ("k", 10**3), ("m", 10**6), ("g", 10**9), ("t", 10**12))},
    **{f"{p}bit": m for p, m in (("ki", 2**10), ("mi", 2**20), ("gi", 2**30), ("ti", 2**40))},
    **{f"{p}bps": 8 * m for p, m in (("", 1), ("k", 10**3), ("m", 10**6), ("g", 10**9), ("t", 10**12))},
    **{f"{p}bps": 8 * m for p, m in (("ki", 2**10), ("mi", 2**20), ("gi", 2**30), ("ti", 2**40))},
}
_RATE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-z]+)$", re.IGNORECASE)
#: the rates a link can be shaped to, bits/s (tbf's 32-bit bucket and queue sizes bound them)
MIN_RATE = 10**6
MAX_RATE = 100 * 10**9


def parse_rate(rate: str) -> int:
    """The link rate ``rate`` (tc's syntax: ``"100mbit"``, ``"1gbit"``, ``"10gbit"``, ``"125MBps"``) in bits/s.

    A unit is required (tc reads a bare number as bits/s, old tc documentation as
    bytes/s). The rate is rounded down to whole bytes per second, as the kernel
    stores it.

    Parameters
    ----------
    rate : str
        A decimal number and one of :data:`RATE_UNITS` (case-insensitive).

    Returns
    -------
    int
        Bits per second, a multiple of 8.

    Raises
    ------
    TypeError
        If ``rate`` is not a str.
    ValueError
        If ``rate`` is not a number with a known unit, or outside ``[MIN_RATE, MAX_RATE]``.

    Examples
    --------
    >>> parse_rate("1gbit")
    1000000000
    >>> parse_rate("125MBps")
    1000000000
    """
    if not isinstance(rate, str):
        raise TypeError(f"rate must be a str like '1gbit', got {type(rate).__name__}")
    m = _RATE_RE.match(rate.strip())
    unit = m.group(2).lower() if m else ""
    if not m or unit not in RATE_UNITS:
        raise ValueError(
            f"rate {rate!r} is not a link rate: a number and one of the units {', '.join(RATE_UNITS)} "
            "(tc's syntax, e.g. '100mbit', '1gbit', '10gbit')"
        )
    whole, _, frac = m.group(1).partition(".")
    scale = RATE_UNITS[unit]
    bits = (int(whole + frac) * scale) // 10 ** len(frac)
    bits -= bits % 8
    if not MIN_RATE <= bits <= MAX_RATE:
        raise ValueError(
            f"rate {rate!r} ({bits} bit/s) is out of range [{format_rate(MIN_RATE)}, {format_rate(MAX_RATE)}]"
        )
    return bits


def format_rate(bits: int) -> str:
    """A rate in bits/s as tc writes it, with the largest unit that divides it.

    Parameters
    ----------
    bits : int
        Bits per second.

    Returns
    -------
    str
        ``"1gbit"`` for ``10**9``, ``"1500kbit"`` for ``1_500_000``, ``"12bit"`` for ``12``.

    Raises
    ------
    TypeError
        If ``bits`` is not an int.

    Examples
    --------
    >>> format_rate(parse_rate("1gbit"))
    '1gbit'
    """
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits must be an int, got {type(bits).__name__}")
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits % scale == 0:
            return f"{bits // scale}{unit}"
    return f"{bits}bit"
