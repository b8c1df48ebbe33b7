"""Storage tiers: where a shard's column rings live.

``host`` (NumPy, the CPU backend) is built in.  ``pinned`` (page-locked host
memory that GPU kernels read directly over UVA) and ``device`` (CuPy) are
provided by :mod:`gear_flow.gpu` and registered lazily, so that importing
gear_flow never imports CuPy or touches CUDA.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from numba import njit

from ..backend import is_device_array
from ..errors import SpecError
from ..ops.gather import (  # every take and insert
    PARALLEL_MIN_BYTES,
    gather_columns,
    gather_windows,
    scatter_chunks,
    scatter_rows,
)
from .reuse import Reuse

#: large gather outputs of this process, handed out again once their replies are gone
_OUTPUTS = Reuse()


def ring_slots(first: int, n: int, capacity: int, out: np.ndarray | None = None) -> np.ndarray:
    """Slots of ``n <= capacity`` consecutive ring positions from absolute position ``first``.

    Parameters
    ----------
    first : int
        Absolute position of the first (>= 0).
    n : int
        How many, at most ``capacity``.
    capacity : int
        The ring's size.
    out : numpy.ndarray, optional
        int64 ``[n]`` to write them into (a caller's reused buffer: a large
        insert's slots then take no fresh pages).

    Returns
    -------
    numpy.ndarray
        int64 ``[n]``: ``(first + arange(n)) % capacity``, without a
        division per element (a tenth of the time for 10k slots).

    Examples
    --------
    >>> ring_slots(8, 4, 10).tolist()
    [8, 9, 0, 1]
    """
    out = np.empty(n, dtype=np.int64) if out is None else out
    _fill_ring_slots(first % capacity, capacity, out)
    return out


@njit(nogil=True, cache=True)
def _fill_ring_slots(s, capacity, out):
    for i in range(out.shape[0]):  # counting on from s, back to 0 at the ring's end (no division)
        out[i] = s
        s += 1
        if s == capacity:
            s = 0


class StorageTier(ABC):
    """Allocates the arrays of one shard and knows how to gather from them.

    Subclass it for a new tier (implement :meth:`empty` and
    :meth:`gather_windows`) and make it available with :func:`register_tier`.
    """

    #: tier name used in specs and configuration
    name: str = ""

    @abstractmethod
    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of the tier.

        Parameters
        ----------
        shape : tuple of int
            Its shape (``(capacity, *column.shape)`` for a ring).
        dtype : numpy.dtype
            Its dtype.

        Returns
        -------
        numpy.ndarray
            A NumPy array (host tiers) or a CuPy array (``device``).
        """

    @abstractmethod
    def gather_windows(
        self, src: np.ndarray, src_start: np.ndarray, dst_offset: np.ndarray, n_valid: np.ndarray, out: np.ndarray
    ) -> None:
        """Copy windows of ``src`` (``[cap, nbytes]`` uint8) into ``out`` (``[B, L, nbytes]`` uint8).

        Semantics: :func:`gear_flow.ops.gather.gather_windows`.

        Parameters
        ----------
        src : numpy.ndarray
            A column ring viewed as bytes, C-contiguous uint8 ``[capacity, step_nbytes]``.
        src_start : numpy.ndarray
            int64 ``[B]``: ring position of each window's first stored step.
        dst_offset : numpy.ndarray
            int64 ``[B]``: where in its output row that step lands (head padding before it).
        n_valid : numpy.ndarray
            int64 ``[B]``: stored steps copied per window (wrapping at the
            ring's end); the rest of ``out[b]`` is zeroed.
        out : numpy.ndarray
            C-contiguous uint8 ``[B, L, step_nbytes]`` (host memory for host tiers).
        """

    def state(self, name: str, shape: tuple[int, ...], dtype: np.dtype | type, fill: object = 0) -> np.ndarray:
        """Per-item state of a shard (activity, priorities, ...): host memory, whatever the tier.

        A persistent tier (``disk``) keeps it in a file named ``name`` instead,
        so that the shard reopens from its files.

        Parameters
        ----------
        name : str
            What it is (``active``, ``priority``, ...).
        shape : tuple of int
            Its shape.
        dtype : numpy.dtype
            Its dtype.
        fill : scalar, default 0
            Its initial contents.

        Returns
        -------
        numpy.ndarray
            A host array.
        """
        return np.full(shape, fill, dtype=dtype)

    def gather_columns(
        self,
        srcs: Mapping[str, np.ndarray],
        src_start: np.ndarray,
        dst_offset: np.ndarray,
        n_valid: np.ndarray,
        outs: Mapping[str, np.ndarray],
    ) -> None:
        """Gather the same windows of every column of a take: ``srcs[name]`` into ``outs[name]``.

        Semantics: :meth:`gather_windows` applied to each column (this default
        does exactly that).  Tiers for which a call costs more than its bytes
        override it: the GPU tiers gather every column in one kernel launch.

        Parameters
        ----------
        srcs : mapping of str to numpy.ndarray
            Column rings viewed as bytes, C-contiguous uint8 ``[capacity, step_nbytes]``;
            one for every name of ``outs`` (others are ignored).
        src_start : numpy.ndarray
            int64 ``[B]``: ring position of each window's first stored step.
        dst_offset : numpy.ndarray
            int64 ``[B]``: where in its output row that step lands (head padding before it).
        n_valid : numpy.ndarray
            int64 ``[B]``: stored steps copied per window; the rest of each row is zeroed.
        outs : mapping of str to numpy.ndarray
            The columns to gather: C-contiguous uint8 ``[B, L, step_nbytes]`` each.
        """
        for name, out in outs.items():
            self.gather_windows(srcs[name], src_start, dst_offset, n_valid, out)

    def fused_pairs(
        self, srcs: Mapping[str, np.ndarray], outs: Mapping[str, np.ndarray], columns: Sequence[str], n: int
    ) -> tuple | None:
        """The ``(ring, output)`` pairs a compiled take may gather itself, or None: this tier's
        :meth:`gather_columns` gathers (a kernel launch, a readahead, a parallel copy).

        Parameters
        ----------
        srcs : mapping of str to numpy.ndarray
            Column rings viewed as bytes (a shard's ``ring.bytes``).
        outs : mapping of str to numpy.ndarray
            A batch's whole column buffers, uint8 ``[B, L, step_nbytes]``.
        columns : sequence of str
            The columns of the take.
        n : int
            Windows the take gathers.

        Returns
        -------
        tuple or None
            ``((ring, output), ...)`` per column, in ``columns`` order, for
            :func:`gear_flow.storage.windows.take_steps`; None here.
        """
        return None

    def empty_output(self, shape: tuple[int, ...], dtype: np.dtype | type = np.uint8) -> np.ndarray:
        """A buffer this tier's :meth:`gather_windows` can write.

        Parameters
        ----------
        shape : tuple of int
            ``[B, L, step_nbytes]`` for a gather.
        dtype : numpy.dtype, optional
            Element type (uint8 for gathers).

        Returns
        -------
        numpy.ndarray or device array
            Uninitialised; host memory here (a large one possibly used
            before, see :mod:`gear_flow.storage.reuse`), device memory for
            the GPU tiers.
        """
        return _OUTPUTS.empty(shape, dtype)

    def write_rows(self, dst: np.ndarray, pos: int, rows: np.ndarray) -> None:
        """Write ``rows`` into ring ``dst`` at ``pos`` (wrapping).

        Parameters
        ----------
        dst : numpy.ndarray
            A column ring of this tier, ``[capacity, *row]``.
        pos : int
            Ring position of the first row, ``0 <= pos < capacity``.
        rows : numpy.ndarray or device array
            Rows ``[T, *row]``, ``T <= capacity``; device rows (CuPy) are copied to the host first.
        """
        if is_device_array(rows):
            rows = rows.get()
        scatter_rows(dst, pos, rows)

    def write_chunks(self, dst: np.ndarray, pos: int, parts: list) -> None:
        """Write ``parts`` back to back into ring ``dst`` from ``pos`` (wrapping).

        One call per column of an insert; tiers for which a call costs more
        than the bytes (a device copy per episode) batch them.

        Parameters
        ----------
        dst : numpy.ndarray
            A column ring of this tier, ``[capacity, *row]``.
        pos : int
            Ring position of the first row, ``0 <= pos < capacity``.
        parts : list of arrays
            Rows ``[T_k, *row]`` (host or device), ``sum(T_k) <= capacity``.
        """
        cap = dst.shape[0]
        for rows in parts:
            self.write_rows(dst, pos, rows)
            pos = (pos + rows.shape[0]) % cap

    def read_rows(self, src: np.ndarray, pos: int, n: int) -> np.ndarray:
        """Copy ``n`` rows starting at ring ``pos`` (wrapping) to host memory.

        Parameters
        ----------
        src : numpy.ndarray
            A column ring of this tier, ``[capacity, *row]``.
        pos : int
            Ring position of the first row.
        n : int
            Rows to read, ``n <= capacity``.

        Returns
        -------
        numpy.ndarray
            A new host array ``[n, *row]``.
        """
        cap = src.shape[0]
        idx = ring_slots(pos, n, cap)
        return np.asarray(src[idx])


class HostTier(StorageTier):
    """NumPy arrays in ordinary host memory; windows gathered by the numba twin."""

    name = "host"

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def gather_windows(
        self, src: np.ndarray, src_start: np.ndarray, dst_offset: np.ndarray, n_valid: np.ndarray, out: np.ndarray
    ) -> None:
        gather_windows(src, src_start, dst_offset, n_valid, out)

    def gather_columns(
        self,
        srcs: Mapping[str, np.ndarray],
        src_start: np.ndarray,
        dst_offset: np.ndarray,
        n_valid: np.ndarray,
        outs: Mapping[str, np.ndarray],
    ) -> None:
        """:meth:`StorageTier.gather_columns` through :func:`gear_flow.ops.gather.gather_columns`, which checks
        the windows once for all columns (not once per column) and copies only once all of them passed; a
        subclass with a :meth:`gather_windows` of its own gets the default (its method per column)."""
        if type(self).gather_windows is not HostTier.gather_windows:
            return super().gather_columns(srcs, src_start, dst_offset, n_valid, outs)
        # the shard's own ring views and a batch's buffers: checked=True, the extents still are
        gather_columns([srcs[name] for name in outs], src_start, dst_offset, n_valid, list(outs.values()), True)

    def fused_pairs(
        self, srcs: Mapping[str, np.ndarray], outs: Mapping[str, np.ndarray], columns: Sequence[str], n: int
    ) -> tuple | None:
        """:meth:`StorageTier.fused_pairs`: every column's pair when this tier gathers with the numba twin and
        the take is below :data:`~gear_flow.ops.gather.PARALLEL_MIN_BYTES` (the copy
        :func:`~gear_flow.ops.gather.gather_columns` makes in one compiled call; larger takes copy in
        parallel); None for a subclass that gathers its own way."""
        cls = type(self)
        if cls.gather_windows is not HostTier.gather_windows or cls.gather_columns is not HostTier.gather_columns:
            return None
        if not columns:  # (no column to gather: the placement and the rows only)
            return None
        pairs = tuple([(srcs[name], outs[name]) for name in columns])
        if n * sum([o.shape[1] * o.shape[2] for _, o in pairs]) >= PARALLEL_MIN_BYTES:
            return None
        return pairs

    def write_chunks(self, dst: np.ndarray, pos: int, parts: list) -> None:
        """:meth:`StorageTier.write_chunks` as one copy of all parts (:func:`gear_flow.ops.gather.scatter_chunks`):
        one region per episode cost more than the copies when workers share the machine's cores.

        Parameters
        ----------
        dst : numpy.ndarray
            A column ring, ``[capacity, *row]``.
        pos : int
            Ring position of the first row.
        parts : list of arrays
            Rows ``[T_k, *row]`` (host or device) of the ring's row shape and
            dtype, as a shard's validated episodes hold them;
            ``sum(T_k) <= capacity``.
        """
        if set(map(type, parts)) != {np.ndarray}:  # device rows come to the host first
            parts = [rows.get() if is_device_array(rows) else rows for rows in parts]
        scatter_chunks(dst, pos, parts, checked=True)


_TIERS: dict[str, Callable[[], StorageTier]] = {"host": HostTier}


def register_tier(name: str, factory: Callable[[], StorageTier]) -> None:
    """Make a tier available by name (the GPU module registers ``pinned`` and ``device``).

    Parameters
    ----------
    name : str
        The name specs and configuration use (``table.tier``); an existing
        registration under it is replaced.
    factory : callable
        Returns a new tier object; called once per shard.
    """
    _TIERS[name] = factory


def get_tier(tier: str | StorageTier) -> StorageTier:
    """The tier object for a name (importing the GPU tiers on first use).

    Parameters
    ----------
    tier : str or StorageTier
        ``"host"``, ``"pinned"``, ``"device"``, ``"shared"``, ``"disk"`` or a registered
        name; a tier object is returned as is.

    Returns
    -------
    StorageTier
        A new tier object (from the registered factory).

    Raises
    ------
    SpecError
        The name is not registered.
    """
    if isinstance(tier, StorageTier):
        return tier
    if tier not in _TIERS and tier in ("pinned", "device"):
        from .. import gpu  # noqa: F401  registers the GPU tiers
    if tier not in _TIERS and tier == "shared":
        from . import shared  # noqa: F401  registers the shared-memory tier
    if tier not in _TIERS and tier == "disk":
        from . import disk  # noqa: F401  registers the disk tier (which needs a directory: raises)

    try:
        return _TIERS[tier]()
    except KeyError:
        raise SpecError(
            f"storage tier {tier!r} is unknown; available: {sorted(set(_TIERS) | {'pinned', 'device'})}"
        ) from None
