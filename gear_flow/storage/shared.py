"""Column rings in named POSIX shared memory: one copy of a host's trajectories, readable by every process on it.

The ``shared`` tier allocates a shard's rings (and a small header) in
``multiprocessing.shared_memory`` segments owned by the worker that holds the
shard.  Any process on the same machine -- a learner task on another worker,
or the client itself -- maps them once, read-only in spirit, and gathers its
part of a batch straight from them with the same gather code; the owner still
selects (priorities live there) and returns only the windows' positions.

Consistency is a seqlock on the ring: before the owner writes steps
``[w, w + n)`` it publishes ``writing_until = w + n`` in the header, and only
then overwrites the slots of positions ``< w + n - capacity``.  A reader copies
its windows and then reads ``writing_until``; a window that starts at absolute
position ``a`` is intact iff ``a >= writing_until - capacity``.  A torn window
is never returned: the reader redoes the sample.  (Loads and stores of the
header are plain int64 accesses, ordered on x86-64's memory model.)

Segments are named ``gf_<owner pid>_<token>`` and unlinked when the table is
closed or dropped, when the owner exits, or when the worker closes; if the
owner is killed, Python's resource tracker (registered at creation) unlinks
them.  Readers map segments read-only, outside the resource tracker, so that
a reader never unlinks (or stops tracking) an owner's segment.
"""

from __future__ import annotations

import _posixshmem
import math
import mmap
import os
import select
import shutil
import uuid
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from ..errors import ShardLostError
from .base import HostTier, register_tier

PREFIX = "gf_"
#: where this machine's segments live (and the fast lanes' socket directories: :func:`private_dir`)
SHM_DIR = "/dev/shm"
#: a reader's mapping flags where the kernel lacks :data:`MADV_POPULATE_READ`: page tables filled at once (Linux
#: ``MAP_POPULATE``), or the first batches pay a page fault per 4 KB of every window they copy, until the whole
#: ring has been touched once
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
#: ``madvise`` advice that fills a mapping's page tables now (Linux 5.14; its value where Python does not name
#: it): a reader asks for 2 MB pages first (:func:`advise_huge`) and then populates, so the pages it allocates
#: are huge ones where ``/dev/shm`` allows them (``MAP_POPULATE`` fills the tables before any advice can apply)
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
#: header fields (int64): absolute write position, and the end of the write in progress
WRITE_POS, WRITING_UNTIL = 0, 1


def machine_id() -> str:
    """Identifies this machine's shared memory (boot id, hostname fallback), and the host this process
    counts as on (config ``distributed.host-id``).

    Two processes with different ``host-id`` settings treat each other as on
    different hosts even on one machine: no shared rings, no staging
    segments, no Unix lanes between them; their requests go over the TCP lanes or the
    comm.  That is how a cluster on one machine (a test's, a benchmark's)
    runs the paths a learner on another host takes.

    Returns
    -------
    str
        Equal in two processes exactly when they can map the same segments
        and are to.

    Examples
    --------
    >>> import dask
    >>> with dask.config.set({"gear-flow.distributed.host-id": "b"}):
    ...     machine_id().endswith("/b")
    True
    """
    from .. import config

    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            mid = f.read().strip()
    except OSError:
        import socket

        mid = socket.gethostname()
    host = config.get("distributed.host-id")
    return mid if host is None else f"{mid}/{host}"


class SharedTier(HostTier):
    """Host arrays in named shared-memory segments (see the module docstring)."""

    name = "shared"
    shared = True

    def __init__(self):
        self.segments = {}  # id(array) -> SharedMemory
        self.names = {}  # id(array) -> segment name
        # a table dropped or left open at exit without close(): its segments unlinked then, where the resource
        # tracker unlinked them only at exit, warning of "leaked shared_memory objects" to a user who did nothing
        # wrong (a script's table that ends with the script)
        weakref.finalize(self, _unlink_left, self.segments, os.getpid())

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        """A new array in its own shared-memory segment, owned by this tier (see :meth:`release`).

        Parameters
        ----------
        shape : tuple of int
            Its shape.
        dtype : numpy dtype-like
            Its dtype.

        Returns
        -------
        numpy.ndarray
            Zero-filled (a new segment) and backed by a segment named
            ``gf_<pid>_<token>``.
        """
        from multiprocessing import shared_memory

        dtype = np.dtype(dtype)
        size = max(1, math.prod(shape) * dtype.itemsize)
        seg = shared_memory.SharedMemory(create=True, size=size, name=segment_name())
        advise_huge(getattr(seg, "_mmap", None))  # before any page is touched (the mapping is the owner's)
        a = np.ndarray(shape, dtype=dtype, buffer=seg.buf)
        # the mapping lives as long as the array (and its views): NumPy keeps no export on the segment's
        # buffer, so closing it while the array lives (the segment dropped at release) would unmap memory a
        # call racing the table's close, or info() after it, still reads (a segfault)
        weakref.finalize(a, seg.close).atexit = False  # (at exit the process's mappings go with it)
        self.segments[id(a)] = seg
        self.names[id(a)] = seg.name
        return a

    def describe(self, a: np.ndarray) -> dict[str, object]:
        """What a reader needs to map array ``a``.

        Parameters
        ----------
        a : numpy.ndarray
            An array this tier allocated with :meth:`empty`.

        Returns
        -------
        dict
            ``segment`` (its name), ``shape`` (list of int) and ``dtype`` (its ``str``).
        """
        return {"segment": self.names[id(a)], "shape": list(a.shape), "dtype": a.dtype.str}

    def free(self, a: np.ndarray) -> None:
        """Unlink the segment of array ``a`` now (a replaced array; readers that mapped it keep their mapping).

        Parameters
        ----------
        a : numpy.ndarray
            An array this tier allocated with :meth:`empty`; others are ignored.
        """
        seg = self.segments.pop(id(a), None)
        self.names.pop(id(a), None)
        if seg is not None:
            try:
                seg.unlink()
            except FileNotFoundError:
                pass

    def release(self) -> None:
        """Unlink every segment (mappings stay valid until their arrays are gone: :meth:`empty`)."""
        _unlink_all(self.segments)


def _unlink_left(segments: dict, owner: int) -> None:
    """A dropped tier's segments unlinked, in the process that made them (``owner``): a child forked from it
    that exits normally runs the finalizers it inherited, and the segments are its parent's."""
    if os.getpid() == owner:
        _unlink_all(segments)


def _unlink_all(segments: dict) -> None:
    """Unlink ``segments`` (id -> SharedMemory) and forget them."""
    for seg in segments.values():
        try:
            seg.unlink()
        except FileNotFoundError:
            pass
    segments.clear()


register_tier("shared", SharedTier)


class Attached:
    """A reader's mapping of one shard's shared rings: ``bytes[column]`` (uint8 ``[cap, nb]``), ``header`` and
    ``selection`` (its selection state, :class:`~gear_flow.storage.shared_selection.MappedState`, or None).

    Parameters
    ----------
    info : dict
        What the owner published: ``capacity``, ``header`` and ``columns``
        (per column), each segment as :meth:`SharedTier.describe` gives it.
    shard : int
        The shard's id (for the error when a segment is gone).

    Raises
    ------
    ShardLostError
        A segment no longer exists (its worker exited).
    """

    def __init__(self, info: dict[str, Any], shard: int):
        from .shared_selection import MappedState

        self._maps = []
        self.capacity = int(info["capacity"])
        self.header = self.map(info["header"], shard)
        #: the owner's pid, from the segments' names (``gf_<pid>_...``)
        self.owner_pid = int(segment_owner(info["header"]["segment"]))
        self._pidfd = None
        try:  # Linux: a descriptor of the owner process itself (its pid may be reused, the descriptor not)
            self._pidfd = os.pidfd_open(self.owner_pid)
            weakref.finalize(self, os.close, self._pidfd)
        except (AttributeError, OSError):  # no pidfd here, or the owner already gone: kill(pid, 0) decides
            self._pidfd = None
        self.bytes = {
            c: self.map(d, shard).reshape(self.capacity, -1).view(np.uint8) for c, d in info["columns"].items()
        }
        sel = info.get("selection")
        #: the shard's selection state, when its readers may draw from it (None: its owner draws)
        self.selection = None if sel is None else MappedState(sel, shard, self.map)

    def owner_alive(self) -> bool:
        """Whether the process that owns these segments still runs (a reader drawing from a dead owner's
        state would hand out a lost shard's items).

        Returns
        -------
        bool
            False once no process has the pid named in the segments' names.
        """
        if self._pidfd is not None:  # readable once the process has exited, even before its parent reaps it
            return not select.select([self._pidfd], [], [], 0)[0]
        try:
            os.kill(self.owner_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process of that pid: not the owner any more
            return False
        return True

    def map(self, d: dict[str, Any], shard: int) -> np.ndarray:
        """Map one of the owner's segments read-only, kept mapped as long as this object.

        Parameters
        ----------
        d : dict
            Its descriptor (:meth:`SharedTier.describe`).
        shard : int
            The shard's id, for the error.

        Returns
        -------
        numpy.ndarray
            A read-only view of the segment, of the descriptor's shape and dtype.

        Raises
        ------
        ShardLostError
            The segment no longer exists (its worker exited).
        """
        dtype = np.dtype(d["dtype"])
        try:
            m = map_readonly(d["segment"], max(1, math.prod(d["shape"]) * dtype.itemsize))
        except FileNotFoundError:
            raise ShardLostError(
                shard, f"shared-memory segment {d['segment']} of shard {shard} is gone (its worker exited)"
            ) from None
        self._maps.append(m)
        return np.frombuffer(m, dtype=dtype, count=math.prod(d["shape"])).reshape(tuple(d["shape"]))

    def intact(self, src_abs: np.ndarray) -> np.ndarray:
        """Which windows were not overwritten while they were copied (call after copying).

        Parameters
        ----------
        src_abs : numpy.ndarray
            int64 absolute start position of each window copied.

        Returns
        -------
        numpy.ndarray
            bool mask, True where the window is intact; redo the others.
        """
        return src_abs >= int(self.header[WRITING_UNTIL]) - self.capacity


def map_readonly(name: str, size: int | None = None) -> mmap.mmap:
    """Map another process's segment ``name`` read-only, asking for 2 MB pages (:func:`advise_huge`), then
    with its page tables filled (:data:`MADV_POPULATE_READ`; :data:`MAP_FLAGS` on a kernel without it).

    Mapped outside multiprocessing's resource tracker: the segment is its
    owner's, and a tracker shared with the owner must keep tracking it for
    crash cleanup.

    Parameters
    ----------
    name : str
        The segment's name (no leading ``/``).
    size : int, optional
        Bytes to map; default the whole segment.

    Returns
    -------
    mmap.mmap
        The read-only mapping (valid after the segment is unlinked).

    Raises
    ------
    FileNotFoundError
        No such segment on this machine.
    """
    fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0o600)
    try:
        n = os.fstat(fd).st_size if size is None else size
        m = mmap.mmap(fd, n, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        advise_huge(m)  # before its page tables are filled: pages not yet allocated are then allocated huge
        try:
            m.madvise(MADV_POPULATE_READ)
        except (AttributeError, OSError, ValueError):  # an older kernel: populated at mapping, in 4 KB pages
            m.close()
            m = mmap.mmap(fd, n, flags=MAP_FLAGS, prot=mmap.PROT_READ)
        return m
    finally:
        os.close(fd)


def advise_huge(m: mmap.mmap | None) -> None:
    """Ask for 2 MB pages on a segment's mapping (``madvise(MADV_HUGEPAGE)``), the owner's and every
    reader's, before the mapping touches a page.

    Where ``/dev/shm`` allows them (mounted ``huge=advise``, or ``always``;
    the default ``huge=never`` ignores the advice), a page is allocated huge
    when the process that first touches it asked, and the advice is per
    mapping: a reader maps an owner's rings (filling its page tables) before
    the owner has written most of them, so both ask.  A gather from the rings
    then misses the TLB once per 2 MB instead of once per 4 KB of every
    window: 256 random 64 KB windows of a 400 MB segment copied in 0.733 ms
    against 0.906 in 4 KB pages (0.69 from anonymous memory, which has 2 MB
    pages by default).  Nothing happens where the advice is unknown or
    refused.

    Parameters
    ----------
    m : mmap.mmap or None
        The mapping (None: nothing to advise).
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if m is None or advice is None:
        return
    try:
        m.madvise(advice)
    except (OSError, ValueError):
        pass


def segment_name(mark: str = "") -> str:
    """A new name for a segment of this process: ``gf_<pid>_<mark><16 hex>`` (what :func:`sweep` parses).

    Parameters
    ----------
    mark : str, optional
        What the segment is for (letters), after the pid.

    Returns
    -------
    str
        The name (no leading ``/``).
    """
    return f"{PREFIX}{os.getpid()}_{mark}{uuid.uuid4().hex[:16]}"


def private_dir(mark: str) -> str:
    """A new directory only this process's user may enter, named like this process's segments.

    ``<SHM_DIR>/gf_<pid>_<mark><random>`` (mode 0700), so that :func:`sweep`
    removes it once this process is gone; the system's temporary directory
    where there is no ``/dev/shm``.

    Parameters
    ----------
    mark : str
        What the directory is for (letters), after the pid.

    Returns
    -------
    str
        Its path.
    """
    import tempfile

    parent = SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}_{mark}", dir=parent)


def segment_owner(name: str) -> int | None:
    """The pid in a segment's (or private directory's) name, ``gf_<pid>_<token>``.

    Parameters
    ----------
    name : str
        The name, without a leading ``/``.

    Returns
    -------
    int or None
        The owner's pid; None for a name of another form.

    Examples
    --------
    >>> segment_owner("gf_123_lane0a1b"), segment_owner("other")
    (123, None)
    """
    if not name.startswith(PREFIX):
        return None
    try:
        return int(name[len(PREFIX) :].split("_", 1)[0])
    except ValueError:
        return None


def leftover_segments() -> list[str]:
    """gear_flow segments in /dev/shm whose owner process is gone.

    Returns
    -------
    list of str
        Segment names (``gf_<pid>_<token>``) whose ``pid`` no longer runs;
        empty where /dev/shm cannot be listed.
    """
    out = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return out
    for n in names:
        pid = segment_owner(n)
        if pid is None:
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            out.append(n)
        except PermissionError:
            pass
    return out


def sweep(pids: Iterable[int] | None = None) -> list[str]:
    """Unlink the segments of dead owners on this machine.

    Parameters
    ----------
    pids : iterable of int, optional
        Only the segments of these (dead) processes; default every dead
        owner's.

    Returns
    -------
    list of str
        Names of the segments unlinked.
    """
    gone = []
    only = None if pids is None else {int(p) for p in pids}
    for n in leftover_segments():
        if only is not None and segment_owner(n) not in only:
            continue
        path = os.path.join(SHM_DIR, n)
        try:
            if os.path.isdir(path):  # a private_dir (a fast lane's socket)
                shutil.rmtree(path)
            else:
                _posixshmem.shm_unlink("/" + n)
            gone.append(n)
        except FileNotFoundError:
            pass
    if gone:
        import logging

        logging.getLogger(__name__).info("unlinked %d shared-memory segments of exited workers", len(gone))
    return gone
