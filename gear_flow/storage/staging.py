"""Insert staging through shared memory: a client hands episodes to a worker on its machine without the comm.

A client inserting into shards whose worker runs on its machine copies the
episodes once into a segment of its own (``gf_<pid>_st<token>``) and sends
the worker only where each column lies in it; the worker maps the segment
read-only and writes its rings straight from it.  The bytes then move at
memory speed instead of through a loopback socket.  A segment is reused by
the next call only after an insert that was applied everywhere; after a
failed one (a request given up on may still be read by its worker) it is
unlinked and never written again.  A staged part keeps its mapping alive on
the worker, so a transaction settled later by the coordinator still reads
what was sent.  Segments are unlinked at interpreter exit, or swept with the
other segments of a process that died.
"""

from __future__ import annotations

import atexit
import math
import mmap
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import SpecError
from .shared import PREFIX, SHM_DIR, map_readonly, segment_name

#: arrays start at multiples of this many bytes in a staging segment
ALIGN = 64
#: staging segments are ``gf_<pid>_st<hex>``: a worker maps only those (never another table's rings)
MARK = "st"
_NAME = re.compile(rf"^{PREFIX}[0-9]+_{MARK}[0-9a-f]{{16}}$")


class StagingArea:
    """This process's staging segments, handed out one insert call at a time (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: list[Any] = []
        self.owned: dict[str, Any] = {}

    def acquire(self, nbytes: int) -> Any:
        """A segment of at least ``nbytes`` bytes for one call's exclusive use.

        Parameters
        ----------
        nbytes : int
            Bytes needed.

        Returns
        -------
        multiprocessing.shared_memory.SharedMemory
            Give it back with :meth:`release`.
        """
        from multiprocessing import shared_memory

        with self.lock:
            for i, seg in enumerate(self.free):
                if seg.size >= nbytes:
                    return self.free.pop(i)
        size = max(1 << 20, 1 << max(0, int(nbytes) - 1).bit_length())  # powers of two: few sizes, reused
        seg = shared_memory.SharedMemory(create=True, size=size, name=segment_name(MARK))
        with self.lock:
            self.owned[seg.name] = seg
        return seg

    def release(self, seg: Any) -> None:
        """Give a segment back (the call that used it has finished); keeps the two largest.

        Parameters
        ----------
        seg : multiprocessing.shared_memory.SharedMemory
            What :meth:`acquire` returned.
        """
        with self.lock:
            self.free.append(seg)
            self.free.sort(key=lambda s: -s.size)
            drop, self.free = self.free[2:], self.free[:2]
            for s in drop:
                self.owned.pop(s.name, None)
        for s in drop:
            _unlink(s)

    def discard(self, seg: Any) -> None:
        """Unlink a segment that must not be reused (its call failed: a worker may still read it; the
        worker's mapping stays valid after the unlink).

        Parameters
        ----------
        seg : multiprocessing.shared_memory.SharedMemory
            What :meth:`acquire` returned.
        """
        with self.lock:
            self.owned.pop(seg.name, None)
        _unlink(seg)

    def close(self) -> None:
        """Unlink every segment (interpreter exit)."""
        with self.lock:
            segs, self.owned, self.free = list(self.owned.values()), {}, []
        for s in segs:
            _unlink(s)


def _unlink(seg: Any) -> None:
    try:
        seg.unlink()
    except FileNotFoundError:
        pass
    try:
        seg.close()
    except BufferError:  # a view still exists: the mapping goes with it
        pass


_area: StagingArea | None = None
_area_lock = threading.Lock()


def staging_area() -> StagingArea:
    """This process's :class:`StagingArea` (created on first use, unlinked at exit).

    Returns
    -------
    StagingArea
        The process-wide instance.
    """
    global _area
    with _area_lock:
        if _area is None:
            _area = StagingArea()
            atexit.register(_area.close)
        return _area


def stage_chunks(seg: Any, parts: Sequence[dict]) -> None:
    """Copy the ``chunks`` of ``parts`` into ``seg`` and replace them by their places there (in place).

    Each part's ``chunks`` becomes a list of ``{column: [offset, shape,
    dtype]}`` and the part gets ``staged = {"segment": name}``.

    Parameters
    ----------
    seg : multiprocessing.shared_memory.SharedMemory
        A segment large enough (:func:`staged_bytes`).
    parts : sequence of dict
        Insert parts (``chunks``: one ``{column: array}`` per episode).
    """
    buf = np.ndarray((seg.size,), dtype=np.uint8, buffer=seg.buf)
    off = 0
    for p in parts:
        places = []
        for chunk in p["chunks"]:
            where = {}
            for col, a in chunk.items():
                a = np.asarray(a)
                dst = buf[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
                np.copyto(dst, a)
                where[col] = [off, list(a.shape), a.dtype.str]
                off += _aligned(a.nbytes)
            places.append(where)
        p["chunks"] = places
        p["staged"] = {"segment": seg.name}
    del buf


def staged_bytes(parts: Sequence[dict]) -> int:
    """Bytes :func:`stage_chunks` needs for ``parts`` (arrays aligned to :data:`ALIGN`).

    Parameters
    ----------
    parts : sequence of dict
        Insert parts with array ``chunks``.

    Returns
    -------
    int
        Segment size needed.
    """
    return sum(_aligned(np.asarray(a).nbytes) for p in parts for c in p["chunks"] for a in c.values())


def _aligned(n: int) -> int:
    return (int(n) + ALIGN - 1) // ALIGN * ALIGN


_maps: OrderedDict[str, mmap.mmap] = OrderedDict()
_maps_lock = threading.Lock()
#: staging segments a worker keeps mapped (one per client that inserts, typically)
MAPS_KEPT = 8


def read_staged(segment: Any, chunks: Sequence[Any], where: str) -> list[dict]:
    """The chunks of a staged part, as read-only views into the client's segment (worker side).

    Parameters
    ----------
    segment : str
        The segment's name (``gf_<pid>_<token>``).
    chunks : sequence of dict
        Per episode ``{column: [offset, shape, dtype]}``.
    where : str
        Names the part in errors.

    Returns
    -------
    list of dict
        Per episode ``{column: numpy.ndarray}`` (views: the mapping lives as
        long as they do).

    Raises
    ------
    SpecError
        The segment does not exist or is not a gear_flow segment, or a place
        is malformed or reaches past its end.
    """
    if not isinstance(segment, str) or not _NAME.match(segment):
        raise SpecError(f"{where}: staged segment {segment!r} is not a gear_flow staging segment name")
    m = _map(segment, where)
    out = []
    for c in chunks:
        if not isinstance(c, dict):
            raise SpecError(f"{where}: a staged chunk must map columns to [offset, shape, dtype]")
        got = {}
        for col, place in c.items():
            try:
                off, shape, dtype = place
                off, shape, dtype = int(off), tuple(int(x) for x in shape), np.dtype(dtype)
                n = math.prod(shape) * dtype.itemsize
                if off < 0 or min(shape, default=0) < 0 or dtype.hasobject or dtype.itemsize < 1 or off + n > len(m):
                    raise ValueError
                got[col] = np.frombuffer(m, dtype=dtype, count=math.prod(shape), offset=off).reshape(shape)
            except (TypeError, ValueError):
                raise SpecError(
                    f"{where}: column {col!r}: staged place {place!r} is not [offset, shape, dtype] inside the "
                    f"segment ({len(m)} bytes)"
                ) from None
        out.append(got)
    return out


def forget_unlinked() -> int:
    """Let go of the kept mappings of staging segments their clients have unlinked (a client that closed or
    exited): their memory goes with the last view of them, not with the worker.

    Returns
    -------
    int
        Mappings let go of.
    """
    with _maps_lock:
        gone = [s for s in _maps if not os.path.exists(os.path.join(SHM_DIR, s))]
        for s in gone:
            del _maps[s]  # views still in use keep their mapping alive
    return len(gone)


def _map(segment: str, where: str) -> mmap.mmap:
    with _maps_lock:
        m = _maps.get(segment)
        if m is not None:
            _maps.move_to_end(segment)
            return m
    forget_unlinked()
    try:
        m = map_readonly(segment)
    except FileNotFoundError:
        raise SpecError(f"{where}: staged segment {segment} does not exist (on this machine)") from None
    with _maps_lock:
        _maps[segment] = m
        while len(_maps) > MAPS_KEPT:
            _maps.popitem(last=False)  # views still in use keep their mapping alive
    return m
