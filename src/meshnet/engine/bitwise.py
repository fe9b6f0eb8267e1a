"""What "bit-identical" means here, once: the same dtype, the same shape and the same raw bytes.

Comparing values is not the same claim: ``-0.0 == 0.0`` holds and ``NaN == NaN`` does not, so a
value comparison would pass a split that flipped a sign bit and fail one that reproduced a NaN
exactly. Both certifications (``engine.certification``, ``moe.certification``) and every test
that claims bit-identity use ``bit_identical``.
"""

from __future__ import annotations

import numpy as np


def bit_identical(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` have the same dtype and shape and hold exactly the same bytes."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    # tobytes() reads the logical (C) order whatever the strides, so views compare by content.
    return a.tobytes() == b.tobytes()


def describe_difference(expected: np.ndarray, actual: np.ndarray) -> str:
    """Words for how two arrays that are not bit-identical differ (for error messages)."""
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        return f"{actual.dtype}{list(actual.shape)} where {expected.dtype}{list(expected.shape)} was expected"
    differing = int((expected.reshape(-1).view(np.uint8) != actual.reshape(-1).view(np.uint8)).sum())
    with np.errstate(invalid="ignore", over="ignore"):
        gap = np.abs(expected.astype(np.float64) - actual.astype(np.float64))
    finite = gap[np.isfinite(gap)]
    largest = float(finite.max()) if finite.size else 0.0
    if largest == 0.0:
        return f"{differing} byte(s) differ though no finite value does (signed zeros or NaNs)"
    return f"{differing} byte(s) differ, values by up to {largest:g}"
