"""Window gather on the device; twin of :mod:`gear_flow.ops.gather` (``kernels/gather.cu``).

``gather_windows(src, src_start, dst_offset, n_valid, out)`` has the twin's
arguments and semantics (ring wrap, head and tail zero padding).  ``src`` is a
``[cap, nb]`` uint8 view of a column ring in device memory (CuPy) **or** in
pinned host memory (a NumPy array over memory from ``cudaHostAlloc``, as the
``pinned`` tier allocates it); ``out`` is a ``[B, L, nb]`` uint8 CuPy array.

Pinned memory and UVA: on 64-bit platforms CUDA uses one unified virtual
address space for the host and all devices, and page-locked memory allocated
with ``cudaHostAlloc``/``cudaMallocHost`` is mapped into it: "pointers returned
by cudaHostAlloc() can be used directly from within kernels running on these
devices" (CUDA C Programming Guide, *Unified Virtual Address Space*).  The
kernel therefore reads a pinned ring through its host address: a zero-copy
gather over PCIe/NVLink, with no staging copy.  Ordinary (pageable) NumPy
memory is refused with a clear error.

No alignment is assumed: 16-byte accesses where source and destination are
congruent modulo 16 (the common case: obs rows of a multiple of 16 bytes),
8/4/2/1-byte accesses otherwise.

Fused gather.  ``gather_columns(srcs, src_start, dst_offset, n_valid, outs)``
gathers every column of a take in **one** launch (kernel ``gather_columns``):
the columns share the windows, and a table of per-column descriptors (source
and output addresses, capacity, step bytes, pieces, first work item) spreads
the work items (column, window, piece) of all columns over one grid.  Its
twin is the per-column twin applied to each column
(:func:`gear_flow.ops.gather.gather_columns`); per column the result is
exactly :func:`gather_windows`'s, because both kernels run the same device
function per piece.  Why: launched per column, the small columns of a sample
(action, reward, done: a few bytes a step) cost a launch and a grid tail each
(about 3 us on an H200) for a few hundred kilobytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from ...errors import InvalidDataError
from .. import loader
from ..launch import i64

if TYPE_CHECKING:
    import cupy

__all__ = [
    "ColumnTable",
    "check_windows",
    "column_table",
    "columns_launcher",
    "device_pointer",
    "gather_columns",
    "gather_windows",
    "launch_columns",
    "launcher",
    "pack_params",
    "split_params",
    "upload_windows",
]

_THREADS = 256
_PIECE = 32 * 16 * 4  # GATHER_PIECE in gather.cu: bytes one warp copies per work item
_MAX_BLOCKS = 1 << 16
_DESC = 6  # GATHER_DESC in gather.cu: int64 fields per column descriptor
_MAX_COLUMNS = 32  # GATHER_MAX_COLUMNS in gather.cu: columns per fused launch


def device_pointer(a: np.ndarray | cupy.ndarray) -> int:
    """Address at which kernels read ``a``: a CuPy array's, or a pinned NumPy array's mapped address.

    Parameters
    ----------
    a : numpy.ndarray or cupy.ndarray
        A device array, or a NumPy array over page-locked (pinned) host memory.

    Returns
    -------
    int
        The device-visible address of ``a``'s first byte (with UVA, the host
        address itself for pinned memory).

    Raises
    ------
    InvalidDataError
        If ``a`` is neither array type, or is ordinary (pageable) host memory.
    """
    import cupy

    if isinstance(a, cupy.ndarray):
        return int(a.data.ptr)
    if not isinstance(a, np.ndarray):
        raise InvalidDataError(f"expected a cupy.ndarray or a NumPy array in pinned memory, got {type(a).__name__}")
    ptr = int(a.ctypes.data)
    rt = cupy.cuda.runtime
    try:
        attrs = rt.pointerGetAttributes(ptr)
        kind = int(attrs.type)
    except Exception:  # older drivers raise for unregistered host memory
        kind = 0
    host, dev, managed = (
        getattr(rt, n, d) for n, d in (("memoryTypeHost", 1), ("memoryTypeDevice", 2), ("memoryTypeManaged", 3))
    )
    if kind not in (host, dev, managed):
        raise InvalidDataError(
            "the source array is ordinary (pageable) host memory; GPU kernels read only device memory or pinned "
            "host memory: use storage tier 'pinned' or 'device'"
        )
    return int(attrs.devicePointer) or ptr  # with UVA both are the same address


def check_windows(w: np.ndarray, L: int, cap: int) -> None:
    """Validate host windows as the twin does.

    Each window must satisfy ``0 <= src_start < cap``, ``dst_offset >= 0``,
    ``n_valid >= 0``, ``dst_offset + n_valid <= L`` and ``n_valid <= cap``.

    Parameters
    ----------
    w : numpy.ndarray
        int64 ``[3, B]``: rows ``src_start``, ``dst_offset``, ``n_valid``.
    L : int
        Steps per output window.
    cap : int
        Ring capacity in steps.

    Raises
    ------
    IndexError
        Naming the first window that does not fit.
    """
    if not w.shape[1]:
        return
    s, d, n = w
    bad = (s < 0) | (s >= cap) | (d < 0) | (n < 0) | (d > L - n) | (n > cap)  # (d + n may wrap in int64)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise IndexError(
            f"gather_windows: window {b} (src_start={s[b]}, dst_offset={d[b]}, n_valid={n[b]}) does not fit "
            f"a ring of {cap} steps and windows of {L}"
        )


def upload_windows(
    src_start: np.ndarray | cupy.ndarray,
    dst_offset: np.ndarray | cupy.ndarray,
    n_valid: np.ndarray | cupy.ndarray,
    L: int | None = None,
    cap: int | None = None,
) -> cupy.ndarray:
    """The three window arrays as one int64 ``[3, B]`` device array (one host-to-device copy).

    Host inputs are validated by :func:`check_windows` when ``L`` and ``cap``
    are given.  Device inputs are not checked (that would cost a
    synchronisation); the kernel clamps them so that it never reads or writes
    out of bounds.  When some are on the device and some on the host, the
    host ones are uploaded (CuPy refuses to convert a device array to NumPy).

    Parameters
    ----------
    src_start, dst_offset, n_valid : numpy.ndarray or cupy.ndarray
        Integer ``[B]`` each (cast to int64), host or device.
    L : int, optional
        Steps per output window, for validating host windows.
    cap : int, optional
        Ring capacity in steps, for validating host windows.

    Returns
    -------
    cupy.ndarray
        int64 ``[3, B]`` on the current device: rows ``src_start``,
        ``dst_offset``, ``n_valid``.

    Raises
    ------
    IndexError
        If host windows are given with ``L`` and ``cap`` and one does not fit.
    """
    import cupy

    if any(isinstance(x, cupy.ndarray) for x in (src_start, dst_offset, n_valid)):
        parts = [cupy.asarray(x, dtype=np.int64).reshape(-1) for x in (src_start, dst_offset, n_valid)]
        _same_lengths(parts)
        return cupy.stack(parts)
    w = host_windows(src_start, dst_offset, n_valid)
    if L is not None and cap is not None:
        check_windows(w, L, cap)
    return cupy.asarray(w)


def host_windows(src_start: ArrayLike, dst_offset: ArrayLike, n_valid: ArrayLike, B: int | None = None) -> np.ndarray:
    """Host window arrays as one int64 ``[3, B]`` array, one window per entry of each.

    Parameters
    ----------
    src_start, dst_offset, n_valid : array_like
        Integer ``[B]`` each (cast to int64).
    B : int, optional
        Windows the output holds; None: not checked.

    Returns
    -------
    numpy.ndarray
        int64 ``[3, B]``: rows ``src_start``, ``dst_offset``, ``n_valid``.

    Raises
    ------
    InvalidDataError
        Arrays of different lengths (NumPy's own error was raised before), or not ``B`` windows.
    """
    parts = [np.asarray(x, dtype=np.int64).reshape(-1) for x in (src_start, dst_offset, n_valid)]
    _same_lengths(parts)
    if B is not None and parts[0].shape[0] != B:
        raise InvalidDataError(f"{parts[0].shape[0]} windows for an output of {B}")
    return np.stack(parts)


def _same_lengths(parts: list) -> None:
    if len({int(p.shape[0]) for p in parts}) != 1:
        raise InvalidDataError(
            f"src_start, dst_offset and n_valid have {[int(p.shape[0]) for p in parts]} entries; one each per window"
        )


def launcher(src: np.ndarray | cupy.ndarray, out: cupy.ndarray, windows: cupy.ndarray) -> Callable[[], None]:
    """A function that launches the gather of ``windows`` (int64 ``[3, B]`` on the device) into ``out``.

    Everything is checked and resolved once, so the returned function only
    launches (used for CUDA-graph capture and timing).  Semantics:
    :func:`gather_windows`.

    Parameters
    ----------
    src : numpy.ndarray or cupy.ndarray
        C-contiguous uint8 ``[cap, nb]`` ring view, in device or pinned memory.
    out : cupy.ndarray
        C-contiguous uint8 ``[B, L, nb]`` on the device.
    windows : cupy.ndarray
        int64 ``[3, B]`` on the device (:func:`upload_windows`); not checked
        against ``cap`` and ``L`` (the kernel clamps).

    Returns
    -------
    callable
        No arguments; launches on the current stream (does nothing when
        ``B``, ``L`` or ``nb`` is 0).

    Raises
    ------
    InvalidDataError
        If an array has the wrong dtype, rank, layout or type, the row sizes
        differ, ``windows`` is not ``[3, B]``, or ``src`` is pageable host memory.
    """
    import cupy

    if src.ndim != 2 or src.dtype != np.uint8 or not src.flags.c_contiguous:
        raise InvalidDataError(f"src must be a C-contiguous [cap, nbytes] uint8 array, got {src.dtype} {src.shape}")
    if not isinstance(out, cupy.ndarray) or out.ndim != 3 or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise InvalidDataError("out must be a C-contiguous [B, L, nbytes] uint8 cupy.ndarray")
    cap, nb = (int(x) for x in src.shape)
    B, L = int(out.shape[0]), int(out.shape[1])
    if int(out.shape[2]) != nb:
        raise InvalidDataError(f"out rows have {out.shape[2]} bytes, src rows {nb}")
    if windows.shape != (3, B):
        raise InvalidDataError(f"{windows.shape[1]} windows for an output of {B}")
    if B == 0 or L == 0 or nb == 0:
        return lambda: None
    ptr = np.uint64(device_pointer(src))
    pieces = B * (-(-(L * nb) // _PIECE))
    grid = (int(min(_MAX_BLOCKS, -(-pieces // (_THREADS // 32)))),)
    f = loader.function("gather", "gather_windows")
    args = (ptr, i64(cap), i64(nb), windows[0], windows[1], windows[2], out, i64(B), i64(L))

    def launch():
        f(grid, (_THREADS,), args)

    return launch


def gather_windows(
    src: np.ndarray | cupy.ndarray,
    src_start: np.ndarray | cupy.ndarray | None,
    dst_offset: np.ndarray | cupy.ndarray | None,
    n_valid: np.ndarray | cupy.ndarray | None,
    out: cupy.ndarray,
    *,
    windows: cupy.ndarray | None = None,
) -> None:
    """Copy windows of ``src`` (``[cap, nb]`` uint8) into ``out`` (``[B, L, nb]`` uint8, device).

    Semantics: :func:`gear_flow.ops.gather.gather_windows` (ring wrap, head
    and tail zero padding; repeated windows each fill their own output row).
    Launched on the current stream; host windows are validated first, device
    windows are clamped by the kernel.

    Parameters
    ----------
    src : numpy.ndarray or cupy.ndarray
        C-contiguous uint8 ``[cap, nb]`` ring view, in device or pinned memory.
    src_start, dst_offset, n_valid : numpy.ndarray or cupy.ndarray
        Integer ``[B]`` each, host or device: first ring position, head
        padding and valid steps of each window.  Ignored when ``windows`` is given.
    out : cupy.ndarray
        C-contiguous uint8 ``[B, L, nb]`` on the device, written in place.
    windows : cupy.ndarray, optional
        An :func:`upload_windows` result to reuse (several columns, one upload).

    Raises
    ------
    IndexError
        If a host window does not fit the ring or the output.
    InvalidDataError
        If ``src`` or ``out`` is malformed (see :func:`launcher`).
    """
    if windows is None:
        if src.ndim != 2 or out.ndim != 3:
            raise InvalidDataError(f"src must be [cap, nbytes] and out [B, L, nbytes], got {src.shape} and {out.shape}")
        windows = upload_windows(src_start, dst_offset, n_valid, int(out.shape[1]), int(src.shape[0]))
    launcher(src, out, windows)()


# -- fused gather: every column of a take in one launch ------------------------------------------


@dataclass(frozen=True)
class ColumnTable:
    """Host-side plan of a fused gather (:func:`column_table`).

    Attributes
    ----------
    desc : numpy.ndarray
        int64 ``[C, 6]``, one row per non-empty column, the layout the kernel
        reads: source address, output address, ring capacity, step bytes,
        pieces per window, first work item (counted from 0 in each launch).
    B, L : int
        Windows and steps per window (shared by every output).
    cap : int
        Smallest ring capacity among the columns (windows are checked against it).
    launches : tuple of (int, int, int)
        ``(first column, end column, blocks)`` per launch: one unless more
        than 32 columns.
    """

    desc: np.ndarray
    B: int
    L: int
    cap: int
    launches: tuple[tuple[int, int, int], ...]


def column_table(srcs: Sequence, outs: Sequence) -> ColumnTable:
    """Check a take's columns and lay out their descriptors for :func:`launch_columns`.

    Parameters
    ----------
    srcs : sequence of arrays
        Per column a C-contiguous uint8 ``[cap, nb]`` ring view, device or pinned memory.
    outs : sequence of cupy.ndarray
        Per column a C-contiguous uint8 ``[B, L, nb]`` device array (same ``B`` and ``L`` for all).

    Returns
    -------
    ColumnTable
        The descriptors.  Columns of zero-byte steps are left out (nothing to
        copy); the others are ordered by row size, largest first, so that the
        small columns' items fill the grid's tail.
    """
    import cupy

    srcs, outs = list(srcs), list(outs)
    if len(srcs) != len(outs):
        raise InvalidDataError(f"{len(srcs)} sources for {len(outs)} outputs")
    BL = None
    rows, cap = [], None
    for i, (src, out) in enumerate(zip(srcs, outs)):
        if src.ndim != 2 or src.dtype != np.uint8 or not src.flags.c_contiguous:
            raise InvalidDataError(
                f"column {i}: src must be a C-contiguous [cap, nbytes] uint8 array, got {src.dtype} {src.shape}"
            )
        if not isinstance(out, cupy.ndarray) or out.ndim != 3 or out.dtype != np.uint8 or not out.flags.c_contiguous:
            raise InvalidDataError(f"column {i}: out must be a C-contiguous [B, L, nbytes] uint8 cupy.ndarray")
        c, nb = (int(x) for x in src.shape)
        if int(out.shape[2]) != nb:
            raise InvalidDataError(f"column {i}: out rows have {out.shape[2]} bytes, src rows {nb}")
        if BL is None:
            BL = (int(out.shape[0]), int(out.shape[1]))
        elif (int(out.shape[0]), int(out.shape[1])) != BL:
            raise InvalidDataError(f"column {i}: out is [{out.shape[0]}, {out.shape[1]}, .], column 0 is {list(BL)}")
        cap = c if cap is None else min(cap, c)
        if nb:
            rows.append((nb, src, out, c))
    B, L = BL or (0, 0)
    rows.sort(key=lambda r: -r[0])  # stable: equal widths keep the caller's order
    desc = np.zeros((len(rows), _DESC), np.int64)
    launches = []
    if B and L:
        for c0 in range(0, len(rows), _MAX_COLUMNS):
            first = 0
            for c in range(c0, min(c0 + _MAX_COLUMNS, len(rows))):
                nb, src, out, capc = rows[c]
                pieces = -(-(L * nb) // _PIECE)
                desc[c] = (device_pointer(src), int(out.data.ptr), capc, nb, pieces, first)
                first += B * pieces
            c1 = min(c0 + _MAX_COLUMNS, len(rows))
            launches.append((c0, c1, int(min(_MAX_BLOCKS, -(-first // (_THREADS // 32))))))
    return ColumnTable(desc, B, L, 0 if cap is None else cap, tuple(launches))


def launch_columns(table: ColumnTable, desc: cupy.ndarray, windows: cupy.ndarray) -> None:
    """Launch the fused gather of ``table`` (one launch per 32 columns) on the current stream.

    The kernel reaches the columns through addresses in ``desc``: the caller
    keeps the source and output arrays alive until the launch has run (for
    device arrays freed earlier, CuPy's stream-ordered memory pool reuses them
    only behind the launch on the same stream; pinned host memory has no such
    guard).

    Parameters
    ----------
    table : ColumnTable
        From :func:`column_table`.
    desc : cupy.ndarray
        ``table.desc`` on the device (int64 ``[C, 6]``, C-contiguous).
    windows : cupy.ndarray
        int64 ``[3, B]`` on the device: ``src_start``, ``dst_offset``, ``n_valid``.
    """
    if tuple(windows.shape) != (3, table.B):
        raise InvalidDataError(f"windows of shape {tuple(windows.shape)} for {table.B} windows")
    if not table.launches:
        return
    f = loader.function("gather", "gather_columns")
    for c0, c1, grid in table.launches:
        f((grid,), (_THREADS,), (desc[c0:c1], i64(c1 - c0), windows, i64(table.B), i64(table.L)))


def columns_launcher(srcs: Sequence, outs: Sequence, windows: cupy.ndarray) -> Callable[[], None]:
    """A function that launches the fused gather of ``windows`` (int64 ``[3, B]`` on the device).

    Everything is checked and uploaded once (the descriptors), so the returned
    function only launches (CUDA-graph capture and timing).  Semantics:
    :func:`gather_columns`.

    Parameters
    ----------
    srcs, outs : sequence of arrays
        As :func:`column_table` takes them.
    windows : cupy.ndarray
        int64 ``[3, B]`` on the device (:func:`upload_windows`).

    Returns
    -------
    callable
        No arguments; launches on the current stream.
    """
    import cupy

    table = column_table(srcs, outs)
    desc = cupy.asarray(table.desc)
    if tuple(windows.shape) != (3, table.B):
        raise InvalidDataError(f"windows of shape {tuple(windows.shape)} for {table.B} windows")

    def launch():
        launch_columns(table, desc, windows)

    return launch


def pack_params(table: ColumnTable, w: np.ndarray) -> np.ndarray:
    """The descriptors and host windows ``w`` (int64 ``[3, B]``) as one int64 array (one upload).

    Parameters
    ----------
    table : ColumnTable
        From :func:`column_table`.
    w : numpy.ndarray
        int64 ``[3, B]``.

    Returns
    -------
    numpy.ndarray
        int64 ``[6 C + 3 B]``; :func:`split_params` takes its device copy apart.
    """
    return np.concatenate([table.desc.reshape(-1), w.reshape(-1)])


def split_params(table: ColumnTable, params: cupy.ndarray) -> tuple[cupy.ndarray, cupy.ndarray]:
    """``(desc, windows)`` views of a device copy of :func:`pack_params`'s array.

    Parameters
    ----------
    table : ColumnTable
        The table packed.
    params : cupy.ndarray
        int64 ``[6 C + 3 B]`` on the device.

    Returns
    -------
    tuple of cupy.ndarray
        ``desc`` int64 ``[C, 6]`` and ``windows`` int64 ``[3, B]``.
    """
    k = table.desc.size
    return params[:k].reshape(table.desc.shape), params[k:].reshape(3, table.B)


def gather_columns(
    srcs: Sequence,
    src_start: np.ndarray | cupy.ndarray,
    dst_offset: np.ndarray | cupy.ndarray,
    n_valid: np.ndarray | cupy.ndarray,
    outs: Sequence,
) -> None:
    """Gather the same windows of every column ``srcs[i]`` into ``outs[i]``, in one launch.

    Semantics: :func:`gear_flow.ops.gather.gather_columns` (the per-column
    twin applied to each column).  Host windows are validated (against the
    smallest ring) before anything is launched and uploaded together with the
    column descriptors in one host-to-device copy; device windows are not
    checked (the kernel clamps them).

    Duplicates: windows may repeat (each fills its own output row) and
    columns may share a source.  Outputs must not overlap one another: where
    they do, the twin leaves the last column's bytes, the kernel an
    unspecified mix of the columns'.

    Parameters
    ----------
    srcs : sequence of arrays
        Per column a C-contiguous uint8 ``[cap, nb]`` ring view, device or pinned memory.
    src_start, dst_offset, n_valid : array-like
        int64 ``[B]`` each, host or device.
    outs : sequence of cupy.ndarray
        Per column a C-contiguous uint8 ``[B, L, nb]`` device array.
    """
    import cupy

    if not len(outs):
        return
    table = column_table(srcs, outs)
    if any(isinstance(x, cupy.ndarray) for x in (src_start, dst_offset, n_valid)):
        windows = upload_windows(src_start, dst_offset, n_valid)
        desc = cupy.asarray(table.desc)
    else:
        w = host_windows(src_start, dst_offset, n_valid, table.B)
        check_windows(w, table.L, table.cap)
        desc, windows = split_params(table, cupy.asarray(pack_params(table, w)))
    launch_columns(table, desc, windows)
