"""Window gather: copy B windows of steps out of a column ring into one batch.

Every column is viewed as bytes, ``[capacity, step_nbytes]`` uint8, so one
compiled function serves every dtype and shape.  For window ``b`` the steps at
ring positions ``src_start[b] + j`` (mod capacity), ``0 <= j < n_valid[b]``,
land at ``out[b, dst_offset[b] + j]``; every other step of ``out[b]`` is zeroed
(head and tail padding).  A window crosses the ring's end as two contiguous
copies.  Rows are copied as contiguous byte runs (memcpy-like), windows in
parallel over the available cores.

Twin of ``kernels/gather.cu`` (``gather_windows``; :func:`gather_columns`, the
same for several columns, is the twin of its fused ``gather_columns``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter

import numpy as np
from numba import get_num_threads, literal_unroll, njit, prange

from ._mem import DATA, array_headers, copy_bytes, copy_from_address, rows_of, zero_bytes

#: below this many output bytes one thread copies: a parallel region costs tens of
#: microseconds, and much more when the cores are oversubscribed (Dask workers,
#: learners and actors sharing a machine), which would dominate small batches.
PARALLEL_MIN_BYTES = 1 << 20


def gather_windows(
    src: np.ndarray, src_start: np.ndarray, dst_offset: np.ndarray, n_valid: np.ndarray, out: np.ndarray
) -> None:
    """Copy ``B`` windows of ring steps out of ``src`` into ``out``, zero-padding each window.

    Semantics in the module docstring: window ``b`` copies ``n_valid[b]``
    steps from ring position ``src_start[b]`` on (wrapping at ``cap``) to
    ``out[b, dst_offset[b]:dst_offset[b] + n_valid[b]]`` and zeroes the rest of
    ``out[b]``.  Windows may repeat or overlap in ``src``: each fills its own
    output row.  Every extent is checked once before the copies (which check
    nothing): no caller can make them read or write outside ``src`` and ``out``.

    Parameters
    ----------
    src : numpy.ndarray
        C-contiguous uint8 ``[cap, nbytes]``: a column ring viewed as bytes.
    src_start : numpy.ndarray
        int64 ``[B]``: ring position of each window's first valid step, in ``[0, cap)``.
    dst_offset : numpy.ndarray
        int64 ``[B]``: steps of head padding before each window's data (``>= 0``).
    n_valid : numpy.ndarray
        int64 ``[B]``: steps of data per window, ``0 <= n_valid <= cap`` and
        ``dst_offset + n_valid <= L``.
    out : numpy.ndarray
        C-contiguous, writeable uint8 ``[B, L, nbytes]``, written in place.

    Raises
    ------
    IndexError
        If ``src`` or ``out`` has the wrong dtype, rank, layout or row size,
        the window arrays do not hold ``B`` entries each, or a window does not
        fit the ring or the output (the first such window is named).
    """
    _check_pair(src, out, src_start, dst_offset, n_valid)
    _check_windows(src.shape[0], out.shape[1], src_start, dst_offset, n_valid)
    _copy_windows(src, src_start, dst_offset, n_valid, out)


def _check_pair(src, out, src_start, dst_offset, n_valid) -> None:
    """A ring and an output :func:`gather_windows` can copy between, and one window per output row."""
    if not (isinstance(src, np.ndarray) and src.ndim == 2 and src.dtype == np.uint8 and src.flags.c_contiguous):
        raise IndexError(f"gather_windows: src must be a C-contiguous uint8[cap, nbytes] array, got {_desc(src)}")
    if not (isinstance(out, np.ndarray) and out.ndim == 3 and out.dtype == np.uint8 and out.flags.c_contiguous):
        raise IndexError(f"gather_windows: out must be a C-contiguous uint8[B, L, nbytes] array, got {_desc(out)}")
    if out.shape[2] != src.shape[1] or not out.flags.writeable:
        raise IndexError(f"gather_windows: out rows have {out.shape[2]} bytes, src rows {src.shape[1]}")
    B = out.shape[0]
    shapes = (getattr(src_start, "shape", None), getattr(dst_offset, "shape", None), getattr(n_valid, "shape", None))
    if shapes != ((B,), (B,), (B,)):
        raise IndexError(
            f"gather_windows: src_start, dst_offset and n_valid must each hold one entry per row of out ({B})"
        )


def _check_windows(cap: int, L: int, src_start, dst_offset, n_valid) -> None:
    """Every window fits a ring of ``cap`` steps and an output of ``L``: the byte copies check nothing."""
    bad = _first_bad(cap, L, src_start, dst_offset, n_valid)
    if bad >= 0:
        raise IndexError(
            f"gather_windows: window {bad} (src_start={src_start[bad]}, dst_offset={dst_offset[bad]}, "
            f"n_valid={n_valid[bad]}) does not fit a ring of {cap} steps and windows of {L}"
        )


def _copy_windows(src, src_start, dst_offset, n_valid, out) -> None:
    if out.nbytes >= PARALLEL_MIN_BYTES:
        _gather_parallel(src, src_start, dst_offset, n_valid, out)
    else:
        _gather_serial(src, src_start, dst_offset, n_valid, out)


@njit(nogil=True, cache=True)
def _first_bad(cap, L, src_start, dst_offset, n_valid):
    for b in range(src_start.shape[0]):
        s, d, n = src_start[b], dst_offset[b], n_valid[b]
        # d > L - n, not d + n > L: a sum near 2**63 wrapped negative and passed (a write 2**63 bytes away)
        if s < 0 or s >= cap or d < 0 or n < 0 or d > L - n or n > cap:
            return b
    return -1


@njit(nogil=True, cache=True)
def _copy_window(sf, of, cap, nb, L, b, s, d, n):
    base = b * L * nb
    first = n if n < cap - s else cap - s
    copy_bytes(of, base + d * nb, sf, s * nb, first * nb)
    if n > first:
        copy_bytes(of, base + (d + first) * nb, sf, 0, (n - first) * nb)
    if d > 0:
        zero_bytes(of, base, d * nb)
    if d + n < L:
        zero_bytes(of, base + (d + n) * nb, (L - d - n) * nb)


# Two separately named functions, not one function jitted twice: numba's on-disk
# cache is keyed by the Python function, and two dispatchers of one function
# overwrite each other's cache entries.
@njit(parallel=True, nogil=True, cache=True)
def _gather_parallel(src, src_start, dst_offset, n_valid, out):
    cap, nb = src.shape[0], src.shape[1]
    L = out.shape[1]
    sf, of = src.reshape(-1), out.reshape(-1)
    for b in prange(out.shape[0]):
        _copy_window(sf, of, cap, nb, L, b, src_start[b], dst_offset[b], n_valid[b])


@njit(nogil=True, cache=True)
def _gather_serial(src, src_start, dst_offset, n_valid, out):
    cap, nb = src.shape[0], src.shape[1]
    L = out.shape[1]
    sf, of = src.reshape(-1), out.reshape(-1)
    for b in range(out.shape[0]):
        _copy_window(sf, of, cap, nb, L, b, src_start[b], dst_offset[b], n_valid[b])


def gather_columns(
    srcs: Sequence[np.ndarray],
    src_start: np.ndarray,
    dst_offset: np.ndarray,
    n_valid: np.ndarray,
    outs: Sequence[np.ndarray],
    checked: bool = False,
) -> None:
    """:func:`gather_windows` of the same windows for each column: ``srcs[i]`` into ``outs[i]``.

    Twin of the fused kernel ``gather_columns`` (``kernels/gather.cu``), which
    gathers every column of a take in one launch; its semantics are defined as
    this loop's.  Columns are independent (each writes only its own output),
    so their order does not matter, as long as the outputs do not overlap
    (where they do, the last column's bytes stay here; the kernel leaves an
    unspecified mix).  Windows may repeat: each fills its own output row.
    A batch below :data:`PARALLEL_MIN_BYTES` is gathered, every column, by one
    compiled call that checks every window first (a sample's fixed cost: one
    call, not a check and a copy per column).

    Parameters
    ----------
    srcs : sequence of numpy.ndarray
        Per column a C-contiguous uint8 ``[cap, nbytes]`` ring view.
    src_start, dst_offset, n_valid : numpy.ndarray
        int64 ``[B]``: the windows, as :func:`gather_windows` takes them.
    outs : sequence of numpy.ndarray
        Per column a C-contiguous uint8 ``[B, L, nbytes]`` output.
    checked : bool, default False
        The caller made the arrays (a shard's ring views and a batch's
        buffers) and vouches for their types: only the extents are checked,
        the windows against the rings and the outputs, and each output's rows
        against its ring's.

    Raises
    ------
    IndexError
        As :func:`gather_windows`, for any column, or not one output per
        source; nothing is copied then.
    """
    if len(srcs) != len(outs):
        raise IndexError(f"gather_columns: {len(srcs)} sources for {len(outs)} outputs")
    if not checked:
        for src, out in zip(srcs, outs):
            _check_pair(src, out, src_start, dst_offset, n_valid)
    if not srcs:
        return
    if sum(out.nbytes for out in outs) < PARALLEL_MIN_BYTES:
        if _gather_fused(tuple(zip(srcs, outs)), src_start, dst_offset, n_valid, 0, len(src_start)) < 0:
            return
        for src, out in zip(srcs, outs):  # the first bad extent, named as gather_windows names it
            _check_pair(src, out, src_start, dst_offset, n_valid)
            _check_windows(src.shape[0], out.shape[1], src_start, dst_offset, n_valid)
        raise IndexError("gather_columns: a window does not fit")  # (not reached: the checks above raise)
    seen = set()  # the windows, once per ring length and window length (every column of a take shares both)
    for src, out in zip(srcs, outs):
        extents = (src.shape[0], out.shape[1])
        if extents not in seen:
            _check_windows(*extents, src_start, dst_offset, n_valid)
            seen.add(extents)
    for src, out in zip(srcs, outs):  # nothing is copied unless every column passed
        _copy_windows(src, src_start, dst_offset, n_valid, out)


@njit(nogil=True, cache=True)
def _gather_fused(pairs, src_start, dst_offset, n_valid, off, rows):
    """Every (ring, output) pair's windows in one call, into output rows ``off:off + B`` of outputs of ``rows``
    rows: -1, or with nothing copied the first bad window (or -2: an output whose rows or row bytes do not
    match)."""
    B = src_start.shape[0]
    bad = -1
    for pair in literal_unroll(pairs):
        if bad == -1:
            if pair[1].shape[0] != rows or off < 0 or off + B > rows or pair[1].shape[2] != pair[0].shape[1]:
                bad = -2
            elif dst_offset.shape[0] != B or n_valid.shape[0] != B:
                bad = -2
            else:
                bad = _first_bad(pair[0].shape[0], pair[1].shape[1], src_start, dst_offset, n_valid)
    if bad != -1:
        return bad if bad >= 0 else B
    # a column whose windows are all whole, in one piece, of at most 16 bytes: fixed-size copies in line
    # (_copy_small); any other: each window's first byte read before any copy, as these loads are
    # independent, so their cache misses overlap, where a copy that waits for its row before the next copy
    # starts takes them one at a time (256 one-float rows of a 10M-step ring: 8.7 -> 3.9 us)
    touched = 0
    for pair in literal_unroll(pairs):
        src, out = pair
        cap, nb, L = src.shape[0], src.shape[1], out.shape[1]
        sf, of = src.reshape(-1), out.reshape(-1)
        if L * nb <= 16 and _all_whole(cap, L, src_start, dst_offset, n_valid):
            _copy_small(sf, of, nb, L, src_start, off)
            continue
        for b in range(B):
            if n_valid[b] > 0:
                touched += sf[src_start[b] * nb]
        for b in range(B):
            _copy_window(sf, of, cap, nb, L, off + b, src_start[b], dst_offset[b], n_valid[b])
    return -1 if touched != -1 else -3  # (both success; the result depends on the reads, so they stay)


@njit(nogil=True, cache=True)
def _all_whole(cap, L, src_start, dst_offset, n_valid):
    """Every window holds ``L`` steps, no padding, and does not cross its ring's end."""
    for b in range(src_start.shape[0]):
        if dst_offset[b] != 0 or n_valid[b] != L or src_start[b] > cap - L:
            return False
    return True


@njit(nogil=True, cache=True, inline="always")
def _copy_small(sf, of, nb, L, src_start, off):
    """Whole windows (:func:`_all_whole`) of ``L`` rows of ``nb`` bytes, at most 16 in all, into output rows
    from ``off``.  A copy of a size known when compiled is a load and a store in line, where one of a size
    read at run time is a call to ``memcpy``: 1,024 one-float and one-flag rows 14.5 -> 2.3 us."""
    W = L * nb
    if W == 1:
        _copy_rows(sf, of, nb, src_start, off, 1)
    elif W == 2:
        _copy_rows(sf, of, nb, src_start, off, 2)
    elif W == 4:
        _copy_rows(sf, of, nb, src_start, off, 4)
    elif W == 8:
        _copy_rows(sf, of, nb, src_start, off, 8)
    elif W == 16:
        _copy_rows(sf, of, nb, src_start, off, 16)
    else:  # (3, 5-7, 9-15 bytes: rare row sizes, each a call)
        _copy_rows(sf, of, nb, src_start, off, W)


@njit(nogil=True, cache=True, inline="always")
def _copy_rows(sf, of, nb, src_start, off, W):
    """:func:`_copy_small`'s copies of ``W`` bytes (inlined: a constant ``W`` stays one)."""
    for b in range(src_start.shape[0]):
        copy_bytes(of, (off + b) * W, sf, src_start[b] * nb, W)


def window_mask(dst_offset: np.ndarray, n_valid: np.ndarray, length: int, out: np.ndarray | None = None) -> np.ndarray:
    """Boolean ``[B, L]``: True where a window step holds data, False on padding.

    Parameters
    ----------
    dst_offset : numpy.ndarray
        int ``[B]``: steps of head padding per window.
    n_valid : numpy.ndarray
        int ``[B]``: steps of data per window.
    length : int
        ``L``, steps per window.
    out : numpy.ndarray, optional
        bool ``[B, L]`` to fill in place instead of allocating.

    Returns
    -------
    numpy.ndarray
        bool ``[B, L]``: ``dst_offset[b] <= j < dst_offset[b] + n_valid[b]``
        (``out`` when given).
    """
    if out is None:
        out = np.empty((len(dst_offset), length), dtype=np.bool_)
    elif out.shape != (len(dst_offset), length) or len(n_valid) != len(dst_offset):
        raise ValueError(f"window_mask: out {out.shape} for {len(dst_offset)} windows of {length} steps")
    # compiled: every sample writes its batch's mask, and numpy's broadcast compares cost microseconds
    _fill_mask(np.asarray(dst_offset, dtype=np.int64), np.asarray(n_valid, dtype=np.int64), out, 0)
    return out


@njit(nogil=True, cache=True)
def _fill_mask(dst_offset, n_valid, out, off):
    """Rows ``off:off + B`` of a window mask, compiled (:func:`window_mask`; a batch's rows,
    :func:`gear_flow.ops.rows.fill`): ``out[off + b, j] = dst_offset[b] <= j < dst_offset[b] + n_valid[b]``."""
    for b in range(dst_offset.shape[0]):
        lo, hi = dst_offset[b], dst_offset[b] + n_valid[b]
        for j in range(out.shape[1]):
            out[off + b, j] = lo <= j and j < hi


def _desc(a) -> str:
    return f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__


def check_rows(dst: np.ndarray, pos: int, src: np.ndarray) -> None:
    """Check that ``src`` rows can be written into ring ``dst`` at ``pos``.

    ``src`` must have exactly ``dst``'s row shape and dtype, no more rows than
    the ring holds, and ``pos`` must be a ring position.

    Parameters
    ----------
    dst : numpy.ndarray
        The ring, ``[cap, *row_shape]``.
    pos : int
        Ring position of the first row, in ``[0, cap)``.
    src : numpy.ndarray
        The rows, ``[n, *row_shape]`` of ``dst.dtype``, ``n <= cap``.

    Raises
    ------
    IndexError
        If ``src`` is not such an array, or the rows do not fit.
    """
    if not isinstance(src, np.ndarray) or src.shape[1:] != tuple(dst.shape[1:]) or src.dtype != dst.dtype:
        raise IndexError(f"scatter_rows: rows must be {dst.dtype}[n, *{tuple(dst.shape[1:])}], got {_desc(src)}")
    if not 0 <= pos < dst.shape[0] or src.shape[0] > dst.shape[0]:
        raise IndexError(f"scatter_rows: {src.shape[0]} rows at {pos} do not fit a ring of {dst.shape[0]}")


def scatter_rows(dst: np.ndarray, pos: int, src: np.ndarray) -> None:
    """Write ``src`` rows into ring ``dst`` starting at ``pos``, wrapping at the end.

    Extents are checked first (:func:`check_rows`).  Large contiguous copies
    run in parallel over the available cores.

    Parameters
    ----------
    dst : numpy.ndarray
        The ring, ``[cap, *row_shape]``, written in place.
    pos : int
        Ring position of the first row, in ``[0, cap)``.
    src : numpy.ndarray
        The rows, ``[n, *row_shape]`` of ``dst.dtype``, ``n <= cap``; row
        ``i`` lands at ``(pos + i) % cap``.

    Raises
    ------
    IndexError
        If the rows do not match the ring or do not fit it.
    """
    check_rows(dst, pos, src)
    _scatter(dst, pos, src)


def _scatter(dst: np.ndarray, pos: int, src: np.ndarray) -> None:
    """:func:`scatter_rows` without its checks (made by the caller)."""
    cap = dst.shape[0]
    n = src.shape[0]
    first = min(n, cap - pos)
    _copy(dst[pos : pos + first], src[:first])
    if n > first:
        _copy(dst[: n - first], src[first:])


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    if dst.nbytes >= PARALLEL_MIN_BYTES // 4 and dst.flags.c_contiguous and src.flags.c_contiguous:
        _parallel_copy(dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8))
    else:
        dst[...] = src


#: below this many bytes an insert's many small parts are joined by one thread's ``np.concatenate``: a second
#: thread's hand-off costs more than it saves, and a join this small may still be read from the cache
SPLIT_MIN_BYTES = 8 << 20
_POOL: dict = {}  # process id -> the threads that join the other slices of a large insert (made on first use)
_POOL_LOCK = threading.Lock()


def _copy_pool(k: int) -> ThreadPoolExecutor:
    """This process's helper threads (a child forked after an insert gets its own: the parent's threads
    are not in it)."""
    with _POOL_LOCK:
        pool = _POOL.get(os.getpid())
        if pool is None:
            _POOL.clear()
            pool = _POOL[os.getpid()] = ThreadPoolExecutor(max_workers=k - 1, thread_name_prefix="gear-flow-copy")
        return pool


def join_parts(parts: list, out: np.ndarray, copyable: tuple | None = None) -> None:
    """``np.concatenate(parts, out=out)`` of parts of ``out``'s dtype and row shape; many parts by a compiled
    loop over their addresses, and a large join by one such loop per thread numba may use, each over a
    slice of the parts.

    ``np.concatenate`` releases the GIL only around each part's copy, so two
    threads joining halves of many short episodes contend for it between
    parts; a compiled loop over the parts' addresses copies them all with the
    GIL released.  1,024 parts of 64 KB on this project's 2-core machine, the
    second core free: 1.7 ms, where two threads' ``np.concatenate`` take 2.5
    ms and one 3.1 ms; 1,024 parts of 4 to 256 bytes: 45 us, where it takes 60.
    The parts' addresses are read from the arrays themselves with their
    sizes (:func:`~._mem.array_headers`), where asking each for them would
    cost a microsecond of Python per part; parts that are not C-contiguous
    NumPy arrays of ``out``'s dtype and row shape go through
    ``np.concatenate``, a large join on as many threads.  A host ring's
    insert joins its episodes into the ring with it, and a GPU tier's into
    its page-locked staging buffer.

    Parameters
    ----------
    parts : list of numpy.ndarray
        Rows ``[n_k, *row]`` of ``out``'s dtype and row shape.
    out : numpy.ndarray
        ``[sum(n_k), *row]``, written in place.
    copyable : tuple of numpy.ndarray, optional
        ``(addresses, bytes)`` of each part, C-contiguous and of ``out``'s
        dtype and row shape, as :func:`copyable_parts` gives them (a caller
        that read them already).

    Raises
    ------
    ValueError
        If the parts' bytes are not ``out``'s (nothing is written).
    """
    large = out.nbytes >= SPLIT_MIN_BYTES
    if not large and len(parts) < COMPILED_JOIN_MIN_PARTS:
        np.concatenate(parts, axis=0, out=out)
        return
    if copyable is None:
        copyable = copyable_parts(parts, out)
    if copyable is None:
        size = np.fromiter(map(_NBYTES, parts), dtype=np.int64, count=len(parts))
    else:
        addr, size = copyable
    ends = np.cumsum(size)
    if int(ends[-1]) != out.nbytes:
        raise ValueError(f"join_parts: {int(ends[-1])} bytes of parts for {out.nbytes} bytes of output")
    k = min(get_num_threads(), len(parts)) if large else 1  # slices of about as many bytes, cut between parts
    cuts = [0, *np.searchsorted(ends, [out.nbytes * i // k for i in range(1, k)], side="right").tolist(), len(parts)]
    at = [0 if c == 0 else int(ends[c - 1]) for c in cuts]  # each slice's first byte in out
    if copyable is None:
        row = out.nbytes // out.shape[0]
        _on_threads(
            np.concatenate, [(parts[cuts[i] : cuts[i + 1]], 0, out[at[i] // row : at[i + 1] // row]) for i in range(k)]
        )
        return
    dst = out.reshape(-1).view(np.uint8)
    _on_threads(_copy_parts, [(dst, at[i], addr[cuts[i] : cuts[i + 1]], size[cuts[i] : cuts[i + 1]]) for i in range(k)])


#: from this many parts on, a join below ``SPLIT_MIN_BYTES`` is one compiled loop (``np.concatenate`` costs
#: ~60 ns a part, the compiled loop ~45)
COMPILED_JOIN_MIN_PARTS = 32


def copyable_parts(parts: list, out: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Each part's address and bytes when every part is a C-contiguous NumPy array of ``out``'s dtype and row
    shape and ``out`` is C-contiguous (read off the arrays' headers: :func:`~._mem.array_headers`), else None.

    Parameters
    ----------
    parts : list
        The parts of a join.
    out : numpy.ndarray
        Its output.

    Returns
    -------
    tuple of numpy.ndarray or None
        int64 ``(addresses, bytes)``, one each a part.
    """
    if not out.flags.c_contiguous:
        return None
    head = array_headers(parts)
    if head is None:
        return None
    rows = np.empty(len(parts), dtype=np.int64)
    if not rows_of(head, id(out.dtype), np.array(out.shape[1:], dtype=np.int64), rows):
        return None
    return np.ascontiguousarray(head[:, DATA]), rows * (out.dtype.itemsize * int(np.prod(out.shape[1:])))


_NBYTES = attrgetter("nbytes")


def _on_threads(fn, calls: list) -> None:
    """``fn(*call)`` for every call at once, the first on this thread and the others on the copy pool's
    threads (``fn`` releases the GIL); returns when all are done."""
    futures = [_copy_pool(len(calls)).submit(fn, *call) for call in calls[1:]] if len(calls) > 1 else []
    try:
        fn(*calls[0])
    finally:
        for f in futures:
            f.result()


@njit(nogil=True, cache=True)
def _copy_parts(dst, at, addr, size):
    """Copy ``size[k]`` bytes from address ``addr[k]`` for every ``k``, back to back into ``dst`` from byte
    ``at``."""
    for k in range(addr.shape[0]):
        copy_from_address(dst, at, addr[k], size[k])
        at += size[k]


def scatter_chunks(dst: np.ndarray, pos: int, parts: Sequence[np.ndarray], checked: bool = False) -> None:
    """Write ``parts`` back to back into ring ``dst`` from ``pos`` (wrapping): one column of an insert.

    Every part is checked first (:func:`check_rows`), and all of them must
    fit the ring together.  Parts of 256 KB and more on average are copied
    in *one* parallel region for all parts rather than one per part: a
    region's start and end barrier cost tens of microseconds on a quiet
    machine and far more when workers share its cores (each thread then waits
    at the barrier for one that has no core).  Smaller parts (an insert of
    many short episodes) are joined into the ring per side of its end
    (:func:`join_parts`): by compiled copies from addresses read off the
    parts in bulk (asking each part for its address would cost a microsecond
    of Python, as long as copying 20 KB), on as many threads as numba may use
    above ``SPLIT_MIN_BYTES``; a few parts by ``numpy.concatenate``.  The
    parts' headers are read once, for the count of their rows and the copy.

    Parameters
    ----------
    dst : numpy.ndarray
        The ring, ``[cap, *row_shape]``, written in place.
    pos : int
        Ring position of the first row of the first part, in ``[0, cap)``.
    parts : sequence of numpy.ndarray
        Rows ``[n_k, *row_shape]`` of ``dst.dtype``, ``sum(n_k) <= cap``.
    checked : bool, default False
        The caller has checked every part against the ring's row shape and
        dtype already (a shard's insert: its episodes were validated); only
        the total is checked here.

    Raises
    ------
    IndexError
        If a part is not such an array, or the parts do not fit the ring.
    """
    if not checked:
        for rows in parts:
            check_rows(dst, pos, rows)
    cap = dst.shape[0]
    row = dst.nbytes // cap
    copyable = copyable_parts(parts, dst) if checked and len(parts) >= COMPILED_JOIN_MIN_PARTS else None
    n = sum(map(len, parts)) if copyable is None else int(copyable[1].sum()) // row
    if n > cap:
        raise IndexError(f"scatter_rows: {n} rows do not fit a ring of {cap}")
    if not 0 <= pos < cap:
        raise IndexError(f"scatter_rows: {n} rows at {pos} do not fit a ring of {cap}")
    if len(parts) <= 1:
        for rows in parts:
            _scatter(dst, pos, rows)
        return
    total = n * row
    if (
        total < len(parts) * (PARALLEL_MIN_BYTES // 4)
        or not dst.flags.c_contiguous
        or not all(r.flags.c_contiguous for r in parts)
    ):
        first = min(n, cap - pos)
        if first == n:
            join_parts(parts, dst[pos : pos + n], copyable)
            return
        k, before = 0, 0  # the part that crosses the ring's end, and the rows before it
        while before + parts[k].shape[0] <= first:
            before += parts[k].shape[0]
            k += 1
        cut = first - before
        join_parts([*parts[:k], parts[k][:cut]], dst[pos:])
        join_parts([parts[k][cut:], *parts[k + 1 :]], dst[: n - first])
        return
    dst_off, addr, size = [], [], []
    for rows in parts:  # a part that crosses the ring's end is two copies
        n = rows.shape[0]
        first = min(n, cap - pos)
        for at, skip, k in ((pos, 0, first), (0, first, n - first)):
            if k:
                dst_off.append(at * row)
                addr.append(rows.ctypes.data + skip * row)
                size.append(k * row)
        pos = (pos + n) % cap
    # the copies cut into chunks of at most COPY_CHUNK bytes, the unit of work of a thread
    size = np.array(size, dtype=np.int64)
    pieces = (size + COPY_CHUNK - 1) // COPY_CHUNK
    which = np.repeat(np.arange(len(size)), pieces)
    at = (np.arange(len(which)) - np.repeat(np.cumsum(pieces) - pieces, pieces)) * COPY_CHUNK
    _parallel_copy_many(
        dst.reshape(-1).view(np.uint8),
        np.array(dst_off, dtype=np.int64)[which] + at,
        np.array(addr, dtype=np.uint64)[which] + at.astype(np.uint64),
        np.minimum(size[which] - at, COPY_CHUNK),
    )


#: bytes a thread copies at a time in a parallel copy
COPY_CHUNK = 1 << 18


@njit(parallel=True, nogil=True, cache=True)
def _parallel_copy_many(dst, dst_off, addr, size):
    """Copy ``k``: ``size[k]`` bytes from address ``addr[k]`` to ``dst[dst_off[k]:]``, over the available
    cores in one parallel region."""
    for k in prange(size.shape[0]):
        copy_from_address(dst, dst_off[k], addr[k], size[k])


@njit(parallel=True, nogil=True, cache=True)
def _parallel_copy(dst, src):
    """Byte copy in 256 KiB chunks over the available cores."""
    n = dst.shape[0]
    chunk = 1 << 18
    for c in prange((n + chunk - 1) // chunk):
        a = c * chunk
        b = min(n, a + chunk)
        copy_bytes(dst, a, src, a, b - a)
