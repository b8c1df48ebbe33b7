"""The ``pinned`` tier on the shared-memory data plane: one page-locked copy of a host's trajectories.

GEAR keeps a node's trajectories once, in host memory every GPU of the node
reads directly.  On a distributed table with ``distributed.shared-memory`` on,
a ``pinned`` shard's rings are the named POSIX segments of
:class:`~gear_flow.storage.shared.SharedTier` (same layout, same seqlock
header), page-locked in place with ``cudaHostRegister`` (portable and mapped,
so every device's kernels address them over UVA).  A learner on the same
machine maps the segments read-only (:class:`~gear_flow.storage.shared.Attached`),
registers its mapping read-only (``cudaHostRegisterReadOnly``), and its GPU
gathers the windows straight from them into its device batch — no staging
copy, nothing through the comm.  The seqlock check runs after the gather has
finished (the stream is synchronised first), as on the host.

Such a learner also draws with its GPU: it registers its mapping of a
shard's published selection state the same way, and the draw's inverse-CDF
descent runs the ``tree_find`` kernel over the mapped sum tree
(:func:`state_find`), the same leaves as the host's for the
same targets, so the batch is the one the host draw would make.

Registration is undone before a segment is unlinked (owner) or unmapped
(reader), so the driver never keeps pages of a mapping that is gone.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..backend import require_gpu
from ..storage.shared import Attached, SharedTier
from .tiers import PinnedTier

if TYPE_CHECKING:
    from ..storage.shared_selection import MappedState

#: cudaHostRegister flags (CUDA runtime API)
PORTABLE, MAPPED, READ_ONLY = 0x01, 0x02, 0x08


def register(a: np.ndarray, read_only: bool = False) -> int:
    """Page-lock the memory of host array ``a`` for every device (portable, mapped).

    Parameters
    ----------
    a : numpy.ndarray
        Host memory, e.g. a mapped shared-memory segment (page-aligned there).
    read_only : bool
        The mapping is read-only (a reader's): ``cudaHostRegisterReadOnly``.

    Returns
    -------
    int
        The registered address (what :func:`unregister` takes).
    """
    cp = require_gpu("page-locking a shared segment")
    ptr = int(a.ctypes.data)
    cp.cuda.runtime.hostRegister(ptr, max(int(a.nbytes), 1), PORTABLE | MAPPED | (READ_ONLY if read_only else 0))
    return ptr


def unregister(ptrs: Iterable[int]) -> None:
    """Undo :func:`register` for each address (ignoring ones already undone).

    Parameters
    ----------
    ptrs : iterable of int
        Addresses :func:`register` returned.
    """
    import cupy

    for p in ptrs:
        try:
            cupy.cuda.runtime.hostUnregister(p)
        except cupy.cuda.runtime.CUDARuntimeError:
            pass


class SharedPinnedTier(PinnedTier):
    """``pinned`` rings in named shared-memory segments, page-locked in place (see the module docstring).

    One instance per shard: :meth:`release` unregisters and unlinks that shard's segments.
    """

    name = "pinned"
    shared = True

    def __init__(self):
        super().__init__()
        self._shm = SharedTier()
        self._ptrs: list[int] = []

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An array in a new named segment, page-locked for every device.

        Parameters
        ----------
        shape : tuple of int
            Array shape.
        dtype : numpy.dtype
            Element type.

        Returns
        -------
        numpy.ndarray
            Uninitialised, in shared memory that GPU kernels read over UVA.
        """
        a = self._shm.empty(shape, dtype)
        with self._cp.cuda.Device(self.device_id):
            self._ptrs.append(register(a))
        return a

    def describe(self, a: np.ndarray) -> dict:
        """What a reader needs to map array ``a``.

        Parameters
        ----------
        a : numpy.ndarray
            An array :meth:`empty` returned.

        Returns
        -------
        dict
            ``segment`` name, ``shape`` and ``dtype`` (see :class:`~gear_flow.storage.shared.Attached`).
        """
        return self._shm.describe(a)

    def free(self, a: np.ndarray) -> None:
        """Unregister and unlink array ``a``'s segment now: a replaced array (an episode index that grew).

        Its pages are unlocked before its mapping can go with the array;
        readers that mapped it keep their own mapping and registration.

        Parameters
        ----------
        a : numpy.ndarray
            An array :meth:`empty` returned; others are ignored.
        """
        ptr = int(a.ctypes.data)
        if ptr in self._ptrs:
            self.synchronize()  # no copy issued on this tier still reads it
            with self._cp.cuda.Device(self.device_id):
                unregister([ptr])
            self._ptrs.remove(ptr)
        self._shm.free(a)

    def release(self) -> None:
        """Wait for the gathers issued on the rings, unregister them, unlink the segments."""
        self.synchronize()
        unregister(self._ptrs)
        self._ptrs.clear()
        self._shm.release()


_registered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def registered(sh: Attached) -> Attached:
    """Page-lock a reader's mapping of a shard's rings (read-only, once per mapping).

    Unregistered when the mapping is dropped, before its pages are unmapped.

    Parameters
    ----------
    sh : Attached
        This process's mapping of one shard's segments.

    Returns
    -------
    Attached
        ``sh``, now readable by this process's GPU kernels.
    """
    _register_once(sh, sh.bytes.values())
    return sh


def _register_once(mapping: object, arrays: Iterable[np.ndarray]) -> None:
    """Page-lock ``arrays`` read-only unless ``mapping`` (which keeps them mapped) had them registered; a
    finalizer of ``mapping`` unregisters them, before the arrays it holds let their pages go."""
    if mapping not in _registered:
        ptrs = [register(a, read_only=True) for a in arrays]
        _registered[mapping] = ptrs
        weakref.finalize(mapping, unregister, list(ptrs))


def state_find(sel: MappedState) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """The inverse-CDF find a reader's draw from ``sel`` runs on this process's GPU.

    For :meth:`MappedState.draw <gear_flow.storage.shared_selection.MappedState.draw>`'s
    ``find``: the ``tree_find`` kernel descends the mapped tree in place, so
    only the targets and the leaves cross the host link, and the leaves are
    those of the host's find.  The state block is page-locked read-only on
    first use, once per mapping, and unregistered when the mapping is
    dropped, before its pages are unmapped.

    Parameters
    ----------
    sel : MappedState
        This process's mapping of one shard's published selection state.

    Returns
    -------
    callable
        :func:`gear_flow.gpu.ops.sumtree.find_pinned`: ``find(tree, targets,
        out)``, host arrays in and out, as the numba twin.
    """
    from .ops.sumtree import find_pinned

    _register_once(sel, [sel.block])
    return find_pinned


def gather_shared(
    sh: Attached,
    columns: Sequence[str],
    src_start: np.ndarray,
    dst_offset: np.ndarray,
    n_valid: np.ndarray,
    out: dict,
    o: int,
) -> None:
    """Gather windows of mapped shard ``sh`` into device buffers ``out[c][o:o + B]`` and wait for them.

    The wait makes the seqlock check that follows (:meth:`Attached.intact`) see
    every byte the kernel read.

    Parameters
    ----------
    sh : Attached
        This process's mapping of the shard (registered here on first use).
    columns : sequence of str
        Columns to gather.
    src_start : numpy.ndarray
        int64 ``[B]``: absolute ring position of each window's first stored step.
    dst_offset, n_valid : numpy.ndarray
        int64 ``[B]``: as :func:`gear_flow.ops.gather.gather_windows` takes them.
    out : dict of str to device array
        uint8 ``[rows, L, step_nbytes]`` device buffers per column.
    o : int
        First row of ``out`` to write.
    """
    import cupy

    from .ops.gather import gather_columns

    registered(sh)
    n = len(src_start)
    if not n:
        return
    columns = list(columns)
    # every column in one launch, descriptors and windows in one upload
    gather_columns(
        [sh.bytes[c] for c in columns],
        np.asarray(src_start) % sh.capacity,
        dst_offset,
        n_valid,
        [out[c][o : o + n] for c in columns],
    )
    cupy.cuda.get_current_stream().synchronize()
