"""Byte-size parsing and printing ("2GiB", "512 MB", "1.5e9") for specs and the CLI.

Pure stdlib; binary (KiB/MiB/GiB/TiB) and decimal (KB/MB/GB/TB) suffixes are both accepted.
"""

import re

GiB = 1 << 30

_FACTORS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_PATTERN = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """Parse a size such as "2GiB", "16 GB" or "1.5e9" into bytes.

    Raises:
        ValueError: the text is not a number with a known unit, or is not positive.
    """
    if isinstance(text, (int, float)):
        value = int(text)
    else:
        match = _PATTERN.match(text)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _FACTORS:
            raise ValueError(
                f"cannot read the size {text!r}: write a positive number with an optional unit, "
                "e.g. 2GiB, 512MiB, 16GB or 1.5e9")
        value = int(float(match.group(1)) * _FACTORS[unit])
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive (got {value} bytes)")
    return value


def format_bytes(num_bytes: float) -> str:
    """Render bytes for tables and error messages in the largest unit of GiB, MiB, KiB that
    leaves at least 1 (so 1 KiB is never shown as 0.0 MiB), else whole bytes."""
    for unit, size in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:.1f} {unit}"
    return f"{num_bytes:.0f} B"
