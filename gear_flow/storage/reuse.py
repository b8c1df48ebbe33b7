"""Large gather outputs handed out again once nothing references them.

A worker answering a remote draw gathers its windows into a fresh buffer that
leaves with the reply.  Buffers of megabytes are fresh pages to the kernel
every time (Dask's workers run with ``MALLOC_TRIM_THRESHOLD_`` set, so glibc
maps and unmaps them): the page faults cost more than the gather itself
(256 windows of 64 steps, 16.8 MB: ~4 ms against ~1.5 ms into warm pages).
This pool keeps a few of them per shape and hands one out again only when
its reference count shows that nothing else holds it (the reply was sent,
every view of it is gone).  The count that means "free" is measured at
import, the same way it is read, so the rule holds on any interpreter.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

#: buffers smaller than this are simply allocated
MIN_BYTES = 1 << 20
#: at most this many buffers kept per shape and dtype ...
PER_SHAPE = 4
#: ... and at most this many bytes in all
MAX_BYTES = 256 << 20


def _free_count() -> int:
    probe = [np.empty(1)]
    for a in probe:
        return sys.getrefcount(a)
    raise AssertionError("unreachable")


#: ``sys.getrefcount`` of a kept buffer that nothing else references, read as :meth:`Reuse.empty` reads it
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
        self._kept: dict[tuple, list[np.ndarray]] = {}
        self._bytes = 0

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An uninitialised buffer: a kept one nothing references, else a new one (kept when there is room).

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
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dtype=dtype)
        key = (tuple(int(n) for n in shape), dtype.str)
        with self._lock:
            kept = self._kept.setdefault(key, [])
            for a in kept:
                if sys.getrefcount(a) == FREE:
                    return a
            a = np.empty(shape, dtype=dtype)
            if len(kept) < PER_SHAPE and self._bytes + nbytes <= MAX_BYTES:
                kept.append(a)
                self._bytes += nbytes
            return a
