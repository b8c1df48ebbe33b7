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
"""

from __future__ import annotations

import numpy as np

from ...errors import InvalidDataError
from .. import loader
from ..launch import i64

__all__ = ["check_windows", "device_pointer", "gather_windows", "launcher", "upload_windows"]

_THREADS = 256
_PIECE = 32 * 16 * 4  # GATHER_PIECE in gather.cu: bytes one warp copies per work item
_MAX_BLOCKS = 1 << 16


def device_pointer(a) -> int:
    """Address at which kernels read ``a``: a CuPy array's, or a pinned NumPy array's mapped address."""
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
    """Validate host windows ``w`` (int64 ``[3, B]``) as the twin does (``IndexError`` naming the first bad one):
    ``0 <= src_start < cap``, ``dst_offset >= 0``, ``n_valid >= 0``, ``dst_offset + n_valid <= L``,
    ``n_valid <= cap``."""
    if not w.shape[1]:
        return
    s, d, n = w
    bad = (s < 0) | (s >= cap) | (d < 0) | (n < 0) | (d + n > L) | (n > cap)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise IndexError(
            f"gather_windows: window {b} (src_start={s[b]}, dst_offset={d[b]}, n_valid={n[b]}) does not fit "
            f"a ring of {cap} steps and windows of {L}"
        )


def upload_windows(src_start, dst_offset, n_valid, L: int | None = None, cap: int | None = None):
    """The three window arrays as one int64 ``[3, B]`` device array (one host-to-device copy).

    Host inputs are validated by :func:`check_windows` when ``L`` and ``cap``
    are given.  Device inputs are not checked (that would cost a
    synchronisation); the kernel clamps them so that it never reads or writes
    out of bounds.  When some are on the device and some on the host, the
    host ones are uploaded (CuPy refuses to convert a device array to NumPy).
    """
    import cupy

    if any(isinstance(x, cupy.ndarray) for x in (src_start, dst_offset, n_valid)):
        return cupy.stack([cupy.asarray(x, dtype=np.int64).reshape(-1) for x in (src_start, dst_offset, n_valid)])
    w = np.stack([np.asarray(x, dtype=np.int64).reshape(-1) for x in (src_start, dst_offset, n_valid)])
    if L is not None and cap is not None:
        check_windows(w, L, cap)
    return cupy.asarray(w)


def launcher(src, out, windows):
    """A function that launches the gather of ``windows`` (int64 ``[3, B]`` on the device) into ``out``.

    Everything is checked and resolved once, so the returned function only
    launches (used for CUDA-graph capture and timing).  Semantics:
    :func:`gather_windows`.
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


def gather_windows(src, src_start, dst_offset, n_valid, out, *, windows=None) -> None:
    """Copy windows of ``src`` (``[cap, nb]`` uint8) into ``out`` (``[B, L, nb]`` uint8, device).

    Semantics: :func:`gear_flow.ops.gather.gather_windows`.  ``windows``: an
    :func:`upload_windows` result to reuse (several columns, one upload);
    then the three window arguments are ignored.
    """
    if windows is None:
        if src.ndim != 2 or out.ndim != 3:
            raise InvalidDataError(f"src must be [cap, nbytes] and out [B, L, nbytes], got {src.shape} and {out.shape}")
        windows = upload_windows(src_start, dst_offset, n_valid, int(out.shape[1]), int(src.shape[0]))
    launcher(src, out, windows)()
