"""Human-readable sizes, both ways."""

import re

from .errors import ConfigError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str, what: str) -> int:
    """'65536', '64K', '256M', '7.5G', '1GiB' -> bytes (binary units)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ConfigError(f"{what}={text!r} is not a size; expected bytes or a number with K, M, G or T")
    return int(float(m.group(1)) * (1 << (10 * " kmgt".index(m.group(2).lower() or " "))))

def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
