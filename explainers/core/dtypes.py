"""Number formats for weights and KV caches, as bytes per element.

A dtype is a name (fp32, bf16, fp16, fp8, int8, int4, fp4) or any average bit-width written as a
number ("4.5" means 4.5 bits per element: 4-bit values plus one 16-bit scale per 32 values, say).
Standard library only.
"""
from __future__ import annotations

# Bits per element of the stored values. Block scales of int4/fp4 formats are not included here;
# give the average bit-width as a number to include them (e.g. MXFP4: 4 + 8/32 = 4.25).
DTYPE_BITS: dict[str, float] = {
    "fp32": 32,
    "bf16": 16,
    "fp16": 16,
    "fp8": 8,
    "int8": 8,
    "int4": 4,
    "fp4": 4,
}

MIN_BITS, MAX_BITS = 1.0, 32.0


def dtype_bits(dtype: str) -> float:
    """Bits per element for a dtype name or a bit-width; ValueError with the allowed range otherwise."""
    text = str(dtype).strip().lower()
    if text in DTYPE_BITS:
        return float(DTYPE_BITS[text])
    try:
        bits = float(text)
    except ValueError:
        raise ValueError(f"or a bit-width between {MIN_BITS:g} and {MAX_BITS:g}; got {dtype!r}.") from None
    if not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"or a bit-width between {MIN_BITS:g} and {MAX_BITS:g}; got {bits:g}.")
    return bits


def dtype_bytes(dtype: str) -> float:
    return dtype_bits(dtype) / 8


def dtype_label(dtype: str) -> str:
    """'fp16 (2 bytes)' or '4.5 bits (0.5625 bytes)'."""
    bits = dtype_bits(dtype)
    name = str(dtype).strip().lower()
    head = name if name in DTYPE_BITS else f"{bits:g} bits"
    return f"{head} ({bits / 8:g} bytes)"
