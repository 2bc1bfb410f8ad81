"""Units and formatting. GB and GiB are different numbers, so every byte count says which it is."""
from __future__ import annotations

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB, TiB = 2 ** 10, 2 ** 20, 2 ** 30, 2 ** 40


def thousands(x: float, digits: int = 0) -> str:
    """12345.6 -> '12,346'; keeps `digits` decimals."""
    return f"{x:,.{digits}f}"


def bytes_si(n: float, digits: int = 1) -> str:
    """Decimal units, as datasheets print them: 41,943,040,000 -> '41.9 GB'."""
    for unit, size in (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)):
        if abs(n) >= size:
            return f"{n / size:,.{digits}f} {unit}"
    return f"{n:,.0f} B"


def bytes_iec(n: float, digits: int = 1) -> str:
    """Binary units, as memory is built: 327,680 -> '320.0 KiB'."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:,.{digits}f} {unit}"
    return f"{n:,.0f} B"


def bytes_both(n: float, digits: int = 1) -> str:
    """'41.9 GB = 39.1 GiB': both, so a reader never has to guess which one a page means."""
    return f"{bytes_si(n, digits)} = {bytes_iec(n, digits)}"


def tokens(n: float) -> str:
    """Token counts the way the field writes them, exactly: 4000 -> '4,000', 131072 -> '131,072'."""
    return f"{n:,.0f}"
