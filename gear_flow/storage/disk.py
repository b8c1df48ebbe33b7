"""The ``disk`` tier: a shard's arrays as memory-mapped files, for datasets larger than memory.

Every array of a disk shard -- each column ring, the per-item state
(activity, priorities, stamps, each step's episode), the selectors' trees and
the episode index -- is a file in the shard's directory, mapped shared
(``MAP_SHARED``) and created sparse, so a ring costs no disk until it is
written and no memory until it is read.  Writes go through the same ring code
and gathers read the mappings with the same kernels as the host tier; the
page cache decides what is resident.

What makes the files a table again is :mod:`gear_flow.storage.disk_state`
(the shard's header, commits, flushes and recovery); this module only maps
files, advises the kernel about the windows a batch is about to read, and
accounts for bytes on disk and resident.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike

from ..checkpoint import file_mode, make_dir
from ..errors import CheckpointError, SpecError
from .base import HostTier, register_tier

PAGE = mmap.PAGESIZE
#: mappings of rings are read at random (windows): the kernel's read-around on a fault would read pages no
#: window asked for; batches say what they read next with :meth:`DiskTier.willneed` instead
RING_ADVICE = getattr(mmap, "MADV_RANDOM", None)
#: per thread: do this thread's gathers advise their windows first (:meth:`DiskTier.readahead`)?  None: while the
#: rings are cold
_READAHEAD = threading.local()
#: seconds between two measures of a disk shard's residency (:meth:`DiskTier.rings_cold`)
RESIDENCY_EVERY = 0.5


def _libc():
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        return lib
    except (OSError, AttributeError):  # no mincore here: residency is not reported
        return None


_LIBC = _libc()


def resident_bytes(a: np.ndarray) -> int | None:
    """Bytes of ``a``'s pages now in memory (``mincore``), or None where that cannot be asked.

    Parameters
    ----------
    a : numpy.ndarray
        A C-contiguous array backed by a file mapping.

    Returns
    -------
    int or None
        Resident pages times the page size (the page cache's, whichever process read them).
    """
    if _LIBC is None or a.nbytes == 0:
        return 0 if a.nbytes == 0 else None
    addr = a.ctypes.data
    start = addr - addr % PAGE
    length = addr + a.nbytes - start
    vec = np.zeros(-(-length // PAGE), dtype=np.uint8)
    if _LIBC.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec.ctypes.data_as(ctypes.c_void_p)) != 0:
        return None
    return int(np.count_nonzero(vec & 1)) * PAGE


class DiskTier(HostTier):
    """A shard's arrays as memory-mapped files in one directory (see the module docstring).

    One tier object per shard: it owns the shard's directory.

    Parameters
    ----------
    directory : str or os.PathLike
        The shard's directory; created (with its parents) for a new shard.
    create : bool, default True
        Make new files (the directory must hold no shard); False maps the
        files a shard left there (:meth:`gear_flow.storage.disk_state.DiskStore.check` first).

    Raises
    ------
    SpecError
        ``create`` and the directory already holds a shard.

    Examples
    --------
    >>> import tempfile
    >>> tier = DiskTier(tempfile.mkdtemp() + "/shard-0")
    >>> a = tier.array("x", (4, 2), "float32")
    >>> a[:] = 1.0
    >>> int(tier.bytes_on_disk()) >= 0
    True
    """

    name = "disk"
    #: the arrays are files that outlive the process (:class:`~gear_flow.shard.Shard` attaches a store)
    persistent = True

    def __init__(self, directory: str | os.PathLike[str], *, create: bool = True):
        self.directory = Path(directory).absolute()
        self.create = bool(create)
        if self.create:
            if (self.directory / "layout.json").exists():
                raise SpecError(
                    f"{self.directory} already holds a disk shard; open its table (LocalTable.open) or choose "
                    "another path"
                )
            make_dir(self.directory)
        self.maps: dict[str, mmap.mmap] = {}
        self.arrays: dict[str, np.ndarray] = {}
        #: address of each ring's mapping -> its name: a gather is handed the rings' byte views (same address)
        self._ring_at: dict[int, str] = {}
        #: ``madvise(MADV_WILLNEED)`` calls made for the windows of batches so far (:meth:`willneed_windows`)
        self.advised = 0
        self._measured_at = -math.inf  # when rings_cold() last measured residency, and what it found
        self._cold = True
        self._rng = np.random.default_rng()  # which pages rings_cold() asks about

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        """Scratch host memory (what a disk shard keeps goes through :meth:`array`, which names its file).

        Parameters
        ----------
        shape : tuple of int
            Its shape.
        dtype : numpy dtype-like
            Its dtype.

        Returns
        -------
        numpy.ndarray
            Uninitialised host memory.
        """
        return np.empty(shape, dtype=dtype)

    def path_of(self, name: str) -> Path:
        """The file of array ``name``.

        Parameters
        ----------
        name : str
            The array's name (``ring-0``, ``priority``, ...).

        Returns
        -------
        pathlib.Path
            ``<directory>/<name>.bin``.
        """
        return self.directory / f"{name}.bin"

    def array(
        self, name: str, shape: tuple[int, ...], dtype: DTypeLike, fill: object = 0, new: bool | None = None
    ) -> np.ndarray:
        """Array ``name`` mapped from its file: a new sparse file (filled with ``fill``) or the existing one.

        Parameters
        ----------
        name : str
            Names the file (:meth:`path_of`).
        shape : tuple of int
            Its shape.
        dtype : numpy dtype-like
            Its dtype.
        fill : scalar, default 0
            A new file's contents (0 costs nothing: the file is sparse).
        new : bool, optional
            Make a new file (default: whether this tier creates its shard); an
            open shard makes new ones when its episode index grows.

        Returns
        -------
        numpy.ndarray
            A writable array over the shared mapping (plain ndarray: the kernels take it as they take host memory).

        Raises
        ------
        CheckpointError
            Opening an existing shard and the file is missing or of another size.
        """
        dtype = np.dtype(dtype)
        n = math.prod(shape)
        size = max(1, n * dtype.itemsize)
        path = self.path_of(name)
        fresh = self.create if new is None else bool(new)
        if not fresh and not path.exists():
            raise CheckpointError(f"disk shard {self.directory}: file {path.name} is missing")
        if fresh:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, file_mode())
            os.fchmod(fd, file_mode())
        else:
            fd = os.open(path, os.O_RDWR)
        try:
            if fresh:
                os.ftruncate(fd, size)  # sparse: no block is allocated until written
            elif os.fstat(fd).st_size != size:
                raise CheckpointError(
                    f"disk shard {self.directory}: file {path.name} has {os.fstat(fd).st_size} bytes, its layout "
                    f"says {size} (truncated or from another table)"
                )
            m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        a = np.frombuffer(m, dtype=dtype, count=n).reshape(shape)
        if fresh and fill != 0:
            a[...] = fill
        self.maps[name] = m
        self.arrays[name] = a
        if name.startswith("ring-"):
            self._ring_at[a.ctypes.data] = name
            if RING_ADVICE is not None:
                m.madvise(RING_ADVICE)
        return a

    def state(self, name: str, shape: tuple[int, ...], dtype: DTypeLike, fill: object = 0) -> np.ndarray:
        """Per-item state of the shard: a mapped file too (:meth:`array`), so that the table reopens from its files.

        Parameters
        ----------
        name : str
            Names the file.
        shape : tuple of int
            Its shape.
        dtype : numpy dtype-like
            Its dtype.
        fill : scalar, default 0
            A new array's contents.

        Returns
        -------
        numpy.ndarray
            The mapped array.
        """
        return self.array(name, shape, dtype, fill)

    def discard(self, name: str) -> None:
        """Forget array ``name`` and remove its file (an episode index replaced by a larger one).

        Parameters
        ----------
        name : str
            The array's name.
        """
        a = self.arrays.pop(name, None)
        if a is not None:
            self._ring_at.pop(a.ctypes.data, None)
        self.maps.pop(name, None)  # unmapped once no view of it is left
        try:
            os.unlink(self.path_of(name))
        except FileNotFoundError:
            pass

    def willneed(self, ranges: Mapping[str, Iterable[tuple[int, int]]]) -> None:
        """Ask the kernel to start reading byte ranges of arrays now (``madvise(MADV_WILLNEED)``).

        The reads run in the background, all at once, instead of one page
        fault at a time in the gather that follows.

        Parameters
        ----------
        ranges : mapping of str to iterable of (int, int)
            Per array name, ``(start, stop)`` byte offsets; ranges are widened to pages.
        """
        adv = getattr(mmap, "MADV_WILLNEED", None)
        if adv is None:
            return
        for name, spans in ranges.items():
            m = self.maps.get(name)
            if m is None:
                continue
            size = len(m)
            for a, b in spans:
                a = max(0, int(a)) // PAGE * PAGE
                b = min(size, int(b))
                if b > a:
                    m.madvise(adv, a, b - a)

    @staticmethod
    @contextlib.contextmanager
    def readahead(enabled: bool | None = True) -> Iterator[None]:
        """Within the block, this thread's gathers from disk tiers advise their windows first (or never).

        Each :meth:`gather_columns` then asks the kernel for the pages of
        every window of the take (:meth:`willneed_windows`) before copying
        them, so that cold pages are read all at once rather than one page
        fault at a time.  A :class:`~gear_flow.Stream` over a disk table turns
        it on for its own requests.  Outside any block (or with None) a
        gather advises while its rings are not wholly in the page cache
        (:meth:`rings_cold`): on cached pages the advice is a cost and no
        gain.  Per thread: the gathers of a local table run on the thread
        that samples.

        Parameters
        ----------
        enabled : bool or None, default True
            On, off, or decided by residency inside the block (blocks nest;
            the previous setting comes back on leaving).
        """
        before = getattr(_READAHEAD, "on", None)
        _READAHEAD.on = None if enabled is None else bool(enabled)
        try:
            yield
        finally:
            _READAHEAD.on = before

    def rings_cold(self) -> bool:
        """Whether the rings' written pages are not all in the page cache, as last measured.

        Measured at most every :data:`RESIDENCY_EVERY` seconds and after
        :meth:`drop_cache`, on 32 random pages of each ring's written part
        (``mincore`` of a whole 38 GB ring under memory pressure took seconds,
        and a sample answers "wholly cached or not" as well); where residency
        cannot be asked, the rings count as cold.

        Returns
        -------
        bool
            True: a gather outside a :meth:`readahead` block advises its windows.
        """
        now = time.monotonic()
        if now - self._measured_at >= RESIDENCY_EVERY:
            self._measured_at = now
            self._cold = False
            for name, a in self.arrays.items():
                if not name.startswith("ring-") or a.nbytes == 0:
                    continue
                try:
                    written = min(a.nbytes, self.path_of(name).stat().st_blocks * 512)
                except FileNotFoundError:
                    continue
                if not _pages_resident(a.ctypes.data, written, self._rng.integers(0, max(1, written // PAGE), 32)):
                    self._cold = True
                    break
        return self._cold

    def willneed_windows(
        self, srcs: Mapping[str, np.ndarray], src_start: np.ndarray, n_valid: np.ndarray, probe: bool = True
    ) -> int:
        """Advise the pages of windows of this tier's rings (:meth:`willneed`), coalesced per ring.

        With ``probe``, a ring's windows are advised only when a few of them
        (:data:`PROBES`, spread over the ring) are not wholly in the page
        cache: advising cached pages costs about 1.7 us a range (0.5 ms for
        256 windows of 16 4-KiB steps, as long as the gather itself), the
        probe a tenth of that.

        Parameters
        ----------
        srcs : mapping of str to numpy.ndarray
            Ring byte views ``[capacity, step_nbytes]`` of this tier (as a
            gather gets them); views of other memory are skipped.
        src_start : numpy.ndarray
            int64 ``[B]``: ring position of each window's first stored step.
        n_valid : numpy.ndarray
            int64 ``[B]``: stored steps of each window (wrapping at the ring's end).
        probe : bool, default True
            Skip a ring whose probed windows are all resident.

        Returns
        -------
        int
            ``madvise`` calls made (page ranges after merging the overlapping
            and adjacent ones).
        """
        calls = 0
        for src in srcs.values():
            name = self._ring_at.get(src.ctypes.data)
            if name is None or src.size == 0:
                continue
            if probe and _sampled_resident(src.ctypes.data, src_start, n_valid, src.shape[1], src.shape[0]):
                continue
            starts, stops = window_pages(src_start, n_valid, src.shape[1], src.shape[0])
            self.willneed({name: zip((starts * PAGE).tolist(), (stops * PAGE).tolist())})
            calls += len(starts)
        self.advised += calls
        return calls

    def gather_columns(
        self,
        srcs: Mapping[str, np.ndarray],
        src_start: np.ndarray,
        dst_offset: np.ndarray,
        n_valid: np.ndarray,
        outs: Mapping[str, np.ndarray],
    ) -> None:
        """:meth:`HostTier.gather_columns <gear_flow.storage.base.HostTier.gather_columns>`, the windows
        advised first (:meth:`willneed_windows`) inside a :meth:`readahead` block, or outside one while the
        rings are cold (:meth:`rings_cold`)."""
        on = getattr(_READAHEAD, "on", None)
        if on or (on is None and self.rings_cold()):
            self.willneed_windows({name: srcs[name] for name in outs}, src_start, n_valid)
        super().gather_columns(srcs, src_start, dst_offset, n_valid, outs)

    def sync(self, names: Iterable[str] | None = None) -> None:
        """Write the dirty pages of arrays ``names`` (default all) to their files and wait (``msync``).

        Parameters
        ----------
        names : iterable of str, optional
            Arrays to sync.
        """
        for n in self.maps if names is None else names:
            self.maps[n].flush()

    def drop_cache(self) -> None:
        """Evict this shard's files from the page cache (after syncing them): the next reads come from disk.

        For cold-read benchmarks and tests: ``madvise(MADV_DONTNEED)`` drops
        this process's mappings of the pages, then
        ``posix_fadvise(POSIX_FADV_DONTNEED)`` the cached pages themselves.
        """
        self.sync()
        self._measured_at = -math.inf  # cold now: the next gather measures again
        for name, m in self.maps.items():
            if hasattr(mmap, "MADV_DONTNEED"):
                m.madvise(mmap.MADV_DONTNEED)
            fd = os.open(self.path_of(name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def bytes_on_disk(self) -> int:
        """Blocks the shard's files occupy (sparse rings count what was written).

        Returns
        -------
        int
            Bytes.
        """
        total = 0
        for p in self.directory.iterdir():
            try:
                total += p.stat().st_blocks * 512
            except FileNotFoundError:
                pass
        return total

    def bytes_resident(self, rings: bool | None = None) -> int | None:
        """Bytes of the shard's mapped arrays now in memory (None where ``mincore`` is not available).

        Parameters
        ----------
        rings : bool, optional
            Only the column rings (True), only the rest (False); default all.

        Returns
        -------
        int or None
            Bytes.
        """
        total = 0
        for name, a in self.arrays.items():
            if rings is not None and name.startswith("ring-") != rings:
                continue
            r = resident_bytes(a)
            if r is None:
                return None
            total += r
        return total

    def release(self) -> None:
        """Forget the mappings (they are unmapped once no array views them); the files stay."""
        self.arrays.clear()
        self.maps.clear()
        self._ring_at.clear()


#: windows of a ring probed for residency (``mincore``) before a batch's windows are advised
PROBES = 8


def _ranges_resident(base: int, ranges: Iterable[tuple[int, int]]) -> bool:
    """Are the page ranges ``[a, b)`` (page numbers) of the mapping at page-aligned ``base`` all in the page
    cache?  One ``mincore`` a range; False where it cannot be asked."""
    if _LIBC is None:
        return False
    for a, b in ranges:
        vec = ctypes.create_string_buffer(b - a)
        if _LIBC.mincore(ctypes.c_void_p(base + a * PAGE), ctypes.c_size_t((b - a) * PAGE), vec) != 0:
            return False
        if any(not c & 1 for c in vec.raw[: b - a]):
            return False
    return True


def _pages_resident(base: int, nbytes: int, pages: np.ndarray) -> bool:
    """Are the given pages of the ``nbytes`` mapped at page-aligned ``base`` all in the page cache?"""
    return _ranges_resident(base, ((p, p + 1) for p in np.unique(pages).tolist() if p * PAGE < nbytes))


def _sampled_resident(base: int, src_start: np.ndarray, n_valid: np.ndarray, step_nbytes: int, capacity: int) -> bool:
    """Are :data:`PROBES` of the windows (spread evenly over the batch) of the ring mapped at ``base`` wholly in
    the page cache?  Windows, not merged ranges: a warm batch then costs a few system calls and no merge."""
    B = len(src_start)
    probed = sorted({k * (B - 1) // max(PROBES - 1, 1) for k in range(min(PROBES, B))})
    # a window's head: its part before any wrap
    spans = ((int(src_start[i]), min(int(src_start[i]) + int(n_valid[i]), capacity)) for i in probed if n_valid[i] > 0)
    return _ranges_resident(base, ((s * step_nbytes // PAGE, -(-e * step_nbytes // PAGE)) for s, e in spans))


def window_pages(
    src_start: np.ndarray, n_valid: np.ndarray, step_nbytes: int, capacity: int
) -> tuple[np.ndarray, np.ndarray]:
    """The pages a ring's windows occupy, as sorted ranges with the overlapping and adjacent ones merged.

    Parameters
    ----------
    src_start : numpy.ndarray
        int ``[B]``: ring position of each window's first stored step (``< capacity``).
    n_valid : numpy.ndarray
        int ``[B]``: stored steps of each window; a window wraps at the
        ring's end (two ranges), one with none occupies no page.
    step_nbytes : int
        Bytes of one step of the ring.
    capacity : int
        Steps in the ring.

    Returns
    -------
    starts, stops : numpy.ndarray
        int64 ``[R]``: page numbers, ``[starts[r], stops[r])`` disjoint, not
        adjacent and increasing.

    Examples
    --------
    >>> import numpy as np
    >>> s, e = window_pages(np.array([0, 1, 9]), np.array([1, 1, 2]), PAGE, 10)
    >>> s.tolist(), e.tolist()
    ([0, 9], [2, 10])
    """
    s = np.asarray(src_start, dtype=np.int64)
    n = np.asarray(n_valid, dtype=np.int64)
    keep = n > 0
    s, n = s[keep], n[keep]
    end = s + n
    wrapped = end > capacity
    # a window that wraps is two ranges: its head to the ring's end, and the ring's start to its tail
    lo = np.concatenate([s, np.zeros(int(wrapped.sum()), dtype=np.int64)]) * step_nbytes
    hi = np.concatenate([np.minimum(end, capacity), end[wrapped] - capacity]) * step_nbytes
    if lo.size == 0:
        return lo, hi
    lo, hi = lo // PAGE, -(-hi // PAGE)
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    first = np.ones(lo.size, dtype=bool)
    first[1:] = lo[1:] > reach[:-1]  # a gap before it: a new range starts
    starts = lo[first]
    stops = reach[np.flatnonzero(first)[1:] - 1] if starts.size > 1 else np.empty(0, dtype=np.int64)
    return starts, np.append(stops, reach[-1])


def page_in_bytes() -> int | None:
    """Bytes this process has caused to be read from storage so far (``/proc/self/io`` ``read_bytes``).

    Returns
    -------
    int or None
        Bytes, or None where the kernel does not count them.
    """
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _no_default() -> DiskTier:
    raise SpecError(
        "the disk tier needs a directory per shard: give the table a path (LocalTable(..., tier='disk', "
        "path=...), or gear-flow.disk.path for the workers of a distributed table)"
    )


register_tier("disk", _no_default)
