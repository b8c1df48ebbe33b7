"""Large gather outputs handed out again once nothing references them.

A worker answering a remote draw gathers its windows into a fresh buffer that
leaves with the reply.  Buffers of megabytes are fresh pages to the kernel
every time (Dask's workers run with ``MALLOC_TRIM_THRESHOLD_`` set, so glibc
maps and unmaps them): the page faults cost more than the gather itself
(256 windows of 64 steps, 16.8 MB: ~4 ms against ~1.5 ms into warm pages).
This pool keeps a few of them per size class (a power of two: a part's
rows follow the multinomial draw, so its exact shape rarely repeats) and
hands one out again, viewed as the shape asked for, only when its reference
count shows that nothing else holds it (the reply was sent, every view of
it is gone).  The count that means "free" is measured at import, the same
way it is read; an interpreter without exact reference counts (no
``sys.getrefcount``, or free-threaded) gets fresh buffers every time.
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np

#: buffers smaller than this are simply allocated
MIN_BYTES = 1 << 20
#: at most this many buffers kept per size class ...
PER_SHAPE = 4
#: ... and at most this many bytes in all (kept for the life of the process)
MAX_BYTES = 256 << 20


def _free_count() -> int | None:
    if not hasattr(sys, "getrefcount") or not getattr(sys, "_is_gil_enabled", lambda: True)():
        return None
    probe = [np.empty(1)]
    for a in probe:
        return sys.getrefcount(a)
    return None


#: ``sys.getrefcount`` of a kept buffer that nothing else references, read as :meth:`Reuse.empty` reads it
#: (None: counts not exact here, nothing is reused)
FREE = _free_count()


class Reuse:
    """A pool of large uninitialised NumPy buffers (thread-safe).

    Examples
    --------
    >>> pool = Reuse()
    >>> a = pool.empty((1 << 20,), np.uint8)
    >>> pool.empty((1 << 20,), np.uint8) is a  # still referenced here: a new one
    False
    >>> addr = a.ctypes.data
    >>> del a
    >>> pool.empty((1 << 20,), np.uint8).ctypes.data == addr  # nothing holds it any more: the same memory
    True
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[int, list[np.ndarray]] = {}  # size class -> flat uint8 buffers
        self._bytes = 0

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An uninitialised buffer: part of a kept one nothing references, else of a new one (kept when there
        is room).

        Parameters
        ----------
        shape : tuple of int
            Its shape.
        dtype : numpy.dtype
            Its element type.

        Returns
        -------
        numpy.ndarray
            C-contiguous, writeable.
        """
        dtype = np.dtype(dtype)
        nbytes = math.prod(int(n) for n in shape) * dtype.itemsize
        if nbytes < MIN_BYTES or FREE is None:
            return np.empty(shape, dtype=dtype)
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            kept = self._kept.setdefault(size, [])
            for base in kept:
                if sys.getrefcount(base) == FREE:
                    return base[:nbytes].view(dtype).reshape(shape)
            base = np.empty(size, dtype=np.uint8)
            if len(kept) < PER_SHAPE and self._bytes + size <= MAX_BYTES:
                kept.append(base)
                self._bytes += size
            return base[:nbytes].view(dtype).reshape(shape)
