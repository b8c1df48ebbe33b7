"""Small helpers shared by the kernel wrappers: argument checks and launch sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ..errors import InvalidDataError

if TYPE_CHECKING:
    import cupy

#: threads per block for the grid-stride kernels
THREADS = 256
#: upper bound on blocks of a grid-stride launch (a few waves on any current GPU)
MAX_BLOCKS = 4096


def blocks(n: int, threads: int = THREADS, cap: int = MAX_BLOCKS) -> int:
    """Blocks for ``n`` grid-stride work items.

    Parameters
    ----------
    n : int
        Work items.
    threads : int, default THREADS
        Threads per block.
    cap : int, default MAX_BLOCKS
        Most blocks (the kernels stride over the rest).

    Returns
    -------
    int
        ``ceil(n / threads)`` clipped to ``[1, cap]``.

    Examples
    --------
    >>> blocks(1000), blocks(0), blocks(10**9)
    (4, 1, 4096)
    """
    return int(max(1, min(cap, -(-int(n) // threads))))


def i64(x: int | np.integer) -> np.int64:
    """Scalars are passed to kernels as NumPy scalars so that their C type is explicit.

    Parameters
    ----------
    x : int
        A Python or NumPy integer.

    Returns
    -------
    numpy.int64
        ``x`` as a ``long long`` kernel argument.
    """
    return np.int64(x)


def device_array(x: ArrayLike | cupy.ndarray, dtypes: Sequence[DTypeLike], name: str) -> cupy.ndarray:
    """``x`` as a C-contiguous 1-D CuPy array with a dtype in ``dtypes``.

    Host arrays are copied to the device (on the current stream); arrays of
    another dtype are cast to ``dtypes[0]``.

    Parameters
    ----------
    x : array_like or cupy.ndarray
        The kernel input.
    dtypes : sequence of dtype-like
        Dtypes the kernel accepts; the first is the one to cast to.
    name : str
        The argument's name, for the message.

    Returns
    -------
    cupy.ndarray
        ``x`` itself when already fit, else a copy.

    Raises
    ------
    InvalidDataError
        ``x`` is not 1-D.
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


def check_out(
    out: cupy.ndarray, dtype: DTypeLike, name: str, ndim: int = 1, at_least: int | None = None, of: str = "inputs"
) -> cupy.ndarray:
    """Check a kernel output: outputs are written in place, so no copy can stand in for them.

    Parameters
    ----------
    out : cupy.ndarray
        Must be C-contiguous, of ``dtype`` and ``ndim`` dimensions.
    dtype : dtype-like
        Its required dtype.
    name : str
        The argument's name, for the message.
    ndim : int, default 1
        Its required number of dimensions.
    at_least : int, optional
        Entries (first axis) it needs at least.
    of : str, default "inputs"
        What ``at_least`` counts, for the message.

    Returns
    -------
    cupy.ndarray
        ``out``.

    Raises
    ------
    InvalidDataError
        Not a CuPy array, a wrong dtype, ``ndim`` or layout, or too short.
    """
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


def check_tree(tree: cupy.ndarray, name: str = "tree") -> int:
    """Check a device tree: a C-contiguous 1-D float64 CuPy array of length ``2 * P``, ``P`` a power of two.

    Parameters
    ----------
    tree : cupy.ndarray
        The tree.
    name : str, default "tree"
        The argument's name, for the message.

    Returns
    -------
    int
        ``P``, its number of leaves.

    Raises
    ------
    InvalidDataError
        Anything else.
    """
    check_out(tree, np.float64, name)
    return tree_leaves(tree.shape[0], name)


def tree_leaves(n: int, name: str = "tree") -> int:
    """The leaves ``P`` of a tree of ``n`` entries (``2 * P``, ``P`` a power of two), wherever it lives.

    Parameters
    ----------
    n : int
        Entries of the tree.
    name : str, default "tree"
        The argument's name, for the message.

    Returns
    -------
    int
        ``P``.

    Raises
    ------
    InvalidDataError
        ``n`` is not such a size.
    """
    if n < 2 or n & (n - 1):
        raise InvalidDataError(f"{name} has {n} entries; a tree has 2 * P, P a power of two >= 1")
    return n // 2
