"""GPU storage tiers: ``device`` (CuPy arrays) and ``pinned`` (page-locked host memory).

Both gather with the CUDA kernel of ``kernels/gather.cu`` into device output
buffers (``[B, L, nbytes]`` uint8 CuPy arrays), on CuPy's current stream — the
learner's torch stream while a table samples into
:class:`~gear_flow.sample.SampleBuffers` (see :mod:`gear_flow.gpu.streams`).

Ordering.  Inserts (``write_rows``) and gathers may be issued on different
streams, and a pinned ring is written by the CPU while kernels may still be
reading it.  Each tier instance (one per shard) therefore keeps a fence: the
event recorded after its last device operation.  A device operation first makes
its stream wait for the fence; a host write into a pinned ring first waits for
the fence on the host.  Without this, an insert could overwrite steps that an
already-launched gather has not copied yet.

Constructing either tier needs CuPy and a usable device; otherwise it raises
:class:`~gear_flow.backend.BackendUnavailableError`.  The tier binds to the
current CUDA device at construction (one device per process or Dask worker,
as with dask-cuda).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..backend import require_gpu
from ..ops.gather import join_parts
from ..storage.base import StorageTier

if TYPE_CHECKING:
    import cupy


class _Staging:
    """A reused page-locked host buffer that asynchronous host-to-device copies read from.

    :meth:`take` hands it out again only once the copy that last read it (recorded
    with :meth:`sent`) has finished, growing it on demand: refilling it earlier would
    change bytes a queued copy has not read yet.
    """

    def __init__(self, cp, min_bytes: int):
        self._cp = cp
        self._min = int(min_bytes)
        self._buf = None
        self._done = None  # event after the copy that last read the buffer

    def take(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of the buffer (uint8), free to overwrite."""
        if self._done is not None and not self._done.query():  # done long ago in a steady state: no host wait
            self._done.synchronize()
        if self._buf is None or self._buf.nbytes < nbytes:
            self._buf = np.frombuffer(self._cp.cuda.alloc_pinned_memory(max(nbytes, self._min)), dtype=np.uint8)
        return self._buf[:nbytes]

    def sent(self, event) -> None:
        """The copy reading what :meth:`take` returned is queued; ``event`` follows it."""
        self._done = event


class _GpuTier(StorageTier):
    def __init__(self):
        cp = require_gpu(f"storage tier {self.name!r}")
        self._cp = cp
        self.device_id = int(cp.cuda.runtime.getDevice())
        self._fence = None  # event after the last device operation on this tier's arrays
        self._win_key = None  # host copy of the last uploaded int64 parameters (windows, descriptors)
        self._win = None  # their device copy, a view of _win_dev
        self._win_dev = None  # device buffer the parameters are uploaded into
        self._params_stage = _Staging(cp, 3 * 1024 * 8)  # page-locked source of those uploads

    # -- ordering ---------------------------------------------------------------------
    def _stream(self):
        s = self._cp.cuda.get_current_stream()
        if self._fence is not None:
            s.wait_event(self._fence)
        return s

    def _record(self, stream) -> None:
        ev = self._cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        self._fence = ev

    def synchronize(self) -> None:
        """Block the host until every device operation on this tier's arrays is done."""
        if self._fence is not None:
            self._fence.synchronize()

    # -- gather --------------------------------------------------------------------------
    def _upload(self, a: np.ndarray):
        """A device copy of host int64 array ``a`` (windows, or descriptors and windows).

        A shard gathers with the same arrays while a take lasts, and often
        again (the same output buffers): the device copy is reused while the
        values are unchanged (compared on the host: a few hundred int64,
        microseconds).  The upload goes through a reused pinned staging
        buffer, asynchronously, on the current stream, which the caller's
        :meth:`_stream` has ordered after this tier's last gather (the one
        that may still read the previous copy).
        """
        cp = self._cp
        key = self._win_key
        if key is not None and key.shape == a.shape and np.array_equal(key, a):
            return self._win
        n = a.size
        stage = self._params_stage.take(n * 8).view(np.int64).reshape(a.shape)
        if self._win_dev is None or self._win_dev.size < n:
            self._win_dev = cp.empty(max(n, 3 * 1024), dtype=np.int64)
        stage[...] = a
        dev = self._win_dev[:n].reshape(a.shape)
        s = cp.cuda.get_current_stream()
        dev.set(stage, stream=s)
        done = cp.cuda.Event(disable_timing=True)
        done.record(s)
        self._params_stage.sent(done)
        self._win, self._win_key = dev, a.copy()
        return dev

    def _windows(self, src_start, dst_offset, n_valid, L: int, cap: int):
        from .ops.gather import check_windows, host_windows, upload_windows

        cp = self._cp
        if any(isinstance(x, cp.ndarray) for x in (src_start, dst_offset, n_valid)):
            return upload_windows(src_start, dst_offset, n_valid)
        w = host_windows(src_start, dst_offset, n_valid)
        check_windows(w, L, cap)
        return self._upload(w)

    def gather_windows(self, src, src_start, dst_offset, n_valid, out) -> None:
        """Gather into ``out``, a ``[B, L, nbytes]`` uint8 CuPy array.

        Semantics: :func:`gear_flow.ops.gather.gather_windows`.
        """
        from .ops.gather import gather_windows

        with self._cp.cuda.Device(self.device_id):
            s = self._stream()
            win = self._windows(src_start, dst_offset, n_valid, int(out.shape[1]), int(src.shape[0]))
            gather_windows(src, None, None, None, out, windows=win)
            self._record(s)

    def gather_columns(
        self,
        srcs: Mapping[str, np.ndarray],
        src_start: np.ndarray,
        dst_offset: np.ndarray,
        n_valid: np.ndarray,
        outs: Mapping[str, np.ndarray],
    ) -> None:
        """Gather every column of ``outs`` (``[B, L, nbytes]`` uint8 CuPy arrays) in one kernel launch.

        Semantics: :meth:`gather_windows` per column.  One host-to-device copy
        (the column descriptors and the windows, skipped while unchanged), one
        launch of the fused kernel, ordered by this tier's fence as
        :meth:`gather_windows` is.  Host windows are checked before anything
        is launched.
        """
        from .ops.gather import (
            check_windows,
            column_table,
            host_windows,
            launch_columns,
            pack_params,
            split_params,
            upload_windows,
        )

        names = list(outs)
        if not names:
            return
        cp = self._cp
        table = column_table([srcs[n] for n in names], [outs[n] for n in names])
        with cp.cuda.Device(self.device_id):
            s = self._stream()
            if any(isinstance(x, cp.ndarray) for x in (src_start, dst_offset, n_valid)):
                win = upload_windows(src_start, dst_offset, n_valid)  # on the device already: not checked
                desc = self._upload(table.desc)
            else:
                w = host_windows(src_start, dst_offset, n_valid, table.B)
                check_windows(w, table.L, table.cap)
                desc, win = split_params(table, self._upload(pack_params(table, w)))
            launch_columns(table, desc, win)
            self._record(s)

    def empty_output(self, shape, dtype=np.uint8):
        """A device buffer for gathered windows."""
        with self._cp.cuda.Device(self.device_id):
            return self._cp.empty(shape, dtype=dtype)


class DeviceTier(_GpuTier):
    """Column rings in device memory (CuPy arrays).

    Examples
    --------
    >>> from gear_flow.storage import get_tier
    >>> tier = get_tier("device")          # doctest: +SKIP
    >>> ring = tier.empty((1024, 4), "float32")  # doctest: +SKIP
    """

    name = "device"

    def __init__(self):
        super().__init__()
        self._insert_stage = _Staging(self._cp, 1 << 20)  # page-locked source of batched host inserts

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | str) -> cupy.ndarray:
        """An uninitialised CuPy array on the tier's device.

        Parameters
        ----------
        shape : tuple of int
            Its shape (``(capacity, *column.shape)`` for a ring).
        dtype : numpy.dtype or str
            Its dtype.

        Returns
        -------
        cupy.ndarray
            Allocated from CuPy's memory pool on ``device_id``.
        """
        with self._cp.cuda.Device(self.device_id):
            return self._cp.empty(shape, dtype=dtype)

    def write_rows(self, dst: cupy.ndarray, pos: int, rows: np.ndarray | cupy.ndarray) -> None:
        """Copy ``rows`` into device ring ``dst`` at ``pos``, wrapping at the end.

        Asynchronous on the current stream, ordered after the tier's fence.

        Parameters
        ----------
        dst : cupy.ndarray
            A column ring of this tier, ``[capacity, *row]``.
        pos : int
            Ring position of the first row, ``0 <= pos < capacity``.
        rows : numpy.ndarray or cupy.ndarray
            Rows ``[T, *row]`` of ``dst.dtype``, ``T <= capacity``: host, or
            device (an actor's trajectories on the GPU).

        Raises
        ------
        IndexError
            If the rows do not match the ring's row shape and dtype or do not fit.
        """
        if isinstance(rows, self._cp.ndarray):
            return self._write_device(dst, pos, rows)
        self._write_host(dst, pos, rows)
        if self._page_locked(rows):
            # the copy reads page-locked memory when it runs, not when it is queued: a caller's pinned buffer
            # (an actor's torch tensor) refilled once insert() returned put the new values in the ring
            self._fence.synchronize()

    def _page_locked(self, rows: np.ndarray) -> bool:
        """Whether host array ``rows`` lies in page-locked memory (a copy from it is asynchronous)."""
        cp = self._cp
        try:
            kind = cp.cuda.runtime.pointerGetAttributes(int(rows.ctypes.data)).type
        except Exception:  # (memory CUDA has never heard of: pageable)  # noqa: BLE001
            return False
        return kind == cp.cuda.runtime.memoryTypeHost

    def _write_host(self, dst: cupy.ndarray, pos: int, rows: np.ndarray) -> None:
        """:meth:`write_rows` of host rows, asynchronous: a page-locked source must stay as it is until the
        fence (the insert stage's is kept until then, see :meth:`write_chunks`)."""
        from ..ops.gather import check_rows

        cap = dst.shape[0]
        rows = np.ascontiguousarray(rows)
        check_rows(dst, pos, rows)  # the same extents as the host twin checks
        n = rows.shape[0]
        first = min(n, cap - pos)
        with self._cp.cuda.Device(self.device_id):
            s = self._stream()
            dst[pos : pos + first].set(rows[:first], stream=s)
            if n > first:
                dst[: n - first].set(rows[first:], stream=s)
            self._record(s)

    def _write_device(self, dst, pos: int, rows) -> None:
        if rows.shape[1:] != dst.shape[1:] or rows.dtype != dst.dtype or not 0 <= pos < dst.shape[0]:
            raise IndexError(
                f"scatter_rows: rows must be {dst.dtype}[n, *{tuple(dst.shape[1:])}] at a ring position, got "
                f"{rows.dtype}{list(rows.shape)} at {pos}"
            )
        cap, n = dst.shape[0], rows.shape[0]
        if n > cap:
            raise IndexError(f"scatter_rows: {n} rows at {pos} do not fit a ring of {cap}")
        first = min(n, cap - pos)
        with self._cp.cuda.Device(self.device_id):
            s = self._stream()
            with s:  # device-to-device copies on the tier's ordered stream
                dst[pos : pos + first] = rows[:first]
                if n > first:
                    dst[: n - first] = rows[first:]
            self._record(s)

    def write_chunks(self, dst: cupy.ndarray, pos: int, parts: list) -> None:
        """One copy into the ring per column of an insert, however many episodes it holds.

        Device parts are concatenated on the device (one kernel); host parts
        into a reused page-locked staging buffer (one host copy), from which
        the copy into the ring runs asynchronously, ordered by the fence.  A
        copy per episode would cost a launch or a synchronous pageable copy
        each: at 1024 episodes per insert that, not the bytes, would bound
        collection.

        Parameters
        ----------
        dst : cupy.ndarray
            A column ring of this tier, ``[capacity, *row]``.
        pos : int
            Ring position of the first row, ``0 <= pos < capacity``.
        parts : list of arrays
            Rows ``[T_k, *row]``, all on the host or all on the device (a mix
            falls back to one copy per part), ``sum(T_k) <= capacity``.
        """
        cp = self._cp
        if len(parts) == 1:
            return self.write_rows(dst, pos, parts[0])
        on_dev = [isinstance(p, cp.ndarray) for p in parts]
        if any(on_dev) and not all(on_dev):
            return super().write_chunks(dst, pos, parts)
        with cp.cuda.Device(self.device_id):
            if all(on_dev):
                s = self._stream()
                with s:
                    rows = cp.concatenate(parts)
                return self._write_device(dst, pos, rows)
            n = sum(int(p.shape[0]) for p in parts)
            stage = self._insert_stage.take(n * int(np.prod(dst.shape[1:], dtype=np.int64)) * dst.dtype.itemsize)
            rows = stage.view(dst.dtype).reshape((n, *dst.shape[1:]))
            join_parts(parts, rows)  # (the shard's validated episodes: the ring's dtype and row shape)
            self._write_host(dst, pos, rows)  # from page-locked memory: asynchronous, ordered by the fence
            self._insert_stage.sent(self._fence)

    def read_rows(self, src: cupy.ndarray, pos: int, n: int) -> np.ndarray:
        """Copy ``n`` rows from ring ``pos`` (wrapping) to a host array.

        Synchronous: waits for the copies (and the operations before them).

        Parameters
        ----------
        src : cupy.ndarray
            A column ring of this tier, ``[capacity, *row]``.
        pos : int
            Ring position of the first row, ``0 <= pos < capacity``.
        n : int
            Rows to read, ``n <= capacity``.

        Returns
        -------
        numpy.ndarray
            ``[n, *row]`` of ``src.dtype``.
        """
        cap = src.shape[0]
        first = min(n, cap - pos)
        with self._cp.cuda.Device(self.device_id):
            s = self._stream()
            out = np.empty((n, *src.shape[1:]), dtype=src.dtype)
            src[pos : pos + first].get(stream=s, out=out[:first])
            if n > first:
                src[: n - first].get(stream=s, out=out[first:])
            s.synchronize()
            return out


class PinnedTier(_GpuTier):
    """Column rings in page-locked host memory, gathered by GPU kernels over UVA.

    The arrays are NumPy arrays (inserts and reads are plain host memory
    operations) over memory from :func:`cupy.cuda.alloc_pinned_memory`
    (``cudaHostAlloc``), which with unified virtual addressing is mapped into
    the device's address space at the same address.  Host capacity, not device
    memory, bounds the table; every gather crosses the host link once.

    Examples
    --------
    >>> from gear_flow.storage import get_tier
    >>> tier = get_tier("pinned")           # doctest: +SKIP
    >>> ring = tier.empty((1024, 4), "float32")  # doctest: +SKIP
    """

    name = "pinned"

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
        """An uninitialised NumPy array over page-locked host memory.

        Parameters
        ----------
        shape : tuple of int
            Its shape (``(capacity, *column.shape)`` for a ring).
        dtype : numpy.dtype or str
            Its dtype.

        Returns
        -------
        numpy.ndarray
            Backed by :func:`cupy.cuda.alloc_pinned_memory`, kept alive through
            the array's ``.base``.
        """
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        with self._cp.cuda.Device(self.device_id):
            mem = self._cp.cuda.alloc_pinned_memory(max(count * dtype.itemsize, 1))
        # the NumPy array keeps `mem` (and so the pinned allocation) alive through .base
        return np.frombuffer(mem, dtype=dtype, count=count).reshape(shape)

    def write_rows(self, dst: np.ndarray, pos: int, rows: np.ndarray | cupy.ndarray) -> None:
        """Host write into the pinned ring, after the gathers already issued on it.

        Blocks until every device operation on the tier's arrays is done, so
        that no launched gather reads overwritten steps.

        Parameters
        ----------
        dst : numpy.ndarray
            A pinned column ring, ``[capacity, *row]``.
        pos : int
            Ring position of the first row, ``0 <= pos < capacity``.
        rows : numpy.ndarray or cupy.ndarray
            Rows ``[T, *row]`` of ``dst.dtype``, ``T <= capacity``; device rows
            are copied to the host first.

        Raises
        ------
        IndexError
            If the rows do not match the ring's row shape and dtype or do not fit.
        """
        from ..ops.gather import scatter_rows

        if isinstance(rows, self._cp.ndarray):  # a CuPy array is no host array: scatter_rows refuses it
            rows = rows.get()
        self.synchronize()
        scatter_rows(dst, pos, rows)

    def read_rows(self, src: np.ndarray, pos: int, n: int) -> np.ndarray:
        """Copy ``n`` rows from ring ``pos`` (wrapping) to a new host array.

        Parameters
        ----------
        src : numpy.ndarray
            A pinned column ring, ``[capacity, *row]``.
        pos : int
            Ring position of the first row, ``0 <= pos < capacity``.
        n : int
            Rows to read.

        Returns
        -------
        numpy.ndarray
            ``[n, *row]`` of ``src.dtype``, in ordinary host memory.
        """
        cap = src.shape[0]
        idx = (pos + np.arange(n)) % cap
        return np.asarray(src[idx])
