"""Small helpers shared by the kernel wrappers: argument checks and launch sizes."""

from __future__ import annotations

import numpy as np

from ..errors import InvalidDataError

#: threads per block for the grid-stride kernels
THREADS = 256
#: upper bound on blocks of a grid-stride launch (a few waves on any current GPU)
MAX_BLOCKS = 4096


def blocks(n: int, threads: int = THREADS, cap: int = MAX_BLOCKS) -> int:
    """Blocks for ``n`` grid-stride work items."""
    return int(max(1, min(cap, -(-int(n) // threads))))


def i64(x) -> np.int64:
    """Scalars are passed to kernels as NumPy scalars so that their C type is explicit."""
    return np.int64(x)


def device_array(x, dtypes, name: str):
    """``x`` as a C-contiguous 1-D CuPy array with a dtype in ``dtypes``.

    Host arrays are copied to the device (on the current stream); device arrays
    of another dtype are cast to ``dtypes[0]``.
    """
    import cupy

    dtypes = tuple(np.dtype(d) for d in dtypes)
    a = x if isinstance(x, cupy.ndarray) else np.asarray(x)
    if a.ndim != 1:
        raise InvalidDataError(f"{name} must be 1-D, got shape {a.shape}")
    dt = a.dtype if a.dtype in dtypes else dtypes[0]
    if isinstance(a, cupy.ndarray):
        return cupy.ascontiguousarray(a, dtype=dt)
    return cupy.asarray(np.ascontiguousarray(a, dtype=dt))


def check_out(out, dtype, name: str, ndim: int = 1, at_least: int | None = None, of: str = "inputs"):
    """``out`` must be a C-contiguous CuPy array of ``dtype`` (outputs are written in place),
    with at least ``at_least`` entries (one per ``of``) when given."""
    import cupy

    if not isinstance(out, cupy.ndarray):
        raise InvalidDataError(f"{name} must be a cupy.ndarray (device output), got {type(out).__name__}")
    if out.dtype != np.dtype(dtype) or out.ndim != ndim or not out.flags.c_contiguous:
        raise InvalidDataError(
            f"{name} must be a C-contiguous {ndim}-D {np.dtype(dtype)} array, got {out.dtype} "
            f"shape {out.shape} (contiguous={out.flags.c_contiguous})"
        )
    if at_least is not None and out.shape[0] < at_least:
        raise InvalidDataError(f"{name} has {out.shape[0]} entries for {at_least} {of}")
    return out


def check_tree(tree, name: str = "tree"):
    """A tree is a C-contiguous 1-D float64 CuPy array of length ``2 * P``, ``P`` a power of two."""
    check_out(tree, np.float64, name)
    n = tree.shape[0]
    if n < 2 or n & (n - 1):
        raise InvalidDataError(f"{name} has {n} entries; a tree has 2 * P, P a power of two >= 1")
    return n // 2
