"""Streams, events, graphs and memory kinds of the CUDA emulation: device work runs when the host waits for it.

The model
---------
Every piece of device work (a kernel launch, an asynchronous copy, an
element-wise operation of the fake CuPy array) is *queued* on a stream and
runs only when the host synchronises with that stream, never at the call:

* ``Stream.synchronize()`` runs the stream's queue; ``Event.synchronize()``
  runs its stream up to the position the event recorded;
* host reads of device data (a blocking ``get``, ``cupy.asnumpy``,
  ``float()``/``int()``/``bool()``/``item()``, DLPack export) run the stream
  that carries the read, as CUDA's implicit synchronisation does;
* ``Stream.wait_event(ev)`` queues a dependency: when the waiter reaches it,
  the event's stream first runs up to the recorded position.  Nothing else
  orders two streams, except the legacy default stream (``Stream.null``),
  which waits for and is waited for by every *blocking* stream (created
  without ``non_blocking=True``), as in CUDA.

Host memory is immediate: a host write into pinned memory happens at the
call, while a queued kernel that reads it runs later.  So a missing fence
shows as wrong data (a gather that sees a later insert, a torch tensor read
before the gather that fills it), deterministically.  Copies from pageable
host memory are snapshotted at the call (CUDA stages them), copies from
pinned memory read it when they run.

One device, one lock: queues are mutated and run under :data:`LOCK` (the
emulated kernels share global state), so work issued from several threads is
serialised but keeps each stream's order.

:class:`HostStream` stands in for torch's current CUDA stream: torch here is
CPU-only, so the learner's "stream" is the host, and work issued to it runs
at once (after what it waits for).
"""

from __future__ import annotations

import collections
import itertools
import sys
import threading
import time
import weakref

#: serialises every queue mutation and every execution (one emulated device)
LOCK = threading.RLock()
#: the host's waits for the device so far (stream and event synchronizations, blocking copies to the host,
#: a device synchronization once per stream): tests read it to bound the waits of an operation
HOST_WAITS = [0]


def _wait_for(stream: Stream, pos: int):
    def wait():
        stream._run_until(pos)

    return wait


class Stream:
    """``cupy.cuda.Stream``: a queue of device work, run when the host waits for it.

    Parameters
    ----------
    null : bool
        The legacy default stream (use :attr:`Stream.null`).
    non_blocking : bool
        As ``cudaStreamNonBlocking``: no implicit ordering with the legacy
        default stream.
    """

    null: Stream  # set below
    _live: weakref.WeakSet = weakref.WeakSet()
    _by_ptr: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
    _ptrs = itertools.count(0x7E00, 0x10)
    eager = False

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int = 0, priority: int = 0):
        self.ptr = 0 if null else (int(ptr) or next(Stream._ptrs))
        self.non_blocking = bool(non_blocking)
        self.device_id = 0
        self.priority = priority
        self._ops: collections.deque = collections.deque()
        self._issued = 0  # operations ever queued; an event records a position in this count
        self._done = 0  # operations run
        self._running = False
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # implicit waits already queued
        self._capture: list | None = None
        Stream._live.add(self)
        Stream._by_ptr[self.ptr] = self

    def __repr__(self) -> str:
        return f"<emulated Stream {self.ptr:#x}{' (legacy default)' if self.ptr == 0 else ''}>"

    # -- queueing ---------------------------------------------------------------------------------
    def _enqueue(self, fn, label: str = "") -> None:
        with LOCK:
            if self._capture is not None:
                self._capture.append((fn, label))
                return
            self._implicit_waits()
            self._ops.append((fn, label))
            self._issued += 1
            if self.eager:
                self._run_until(self._issued)

    def _implicit_waits(self) -> None:
        # the legacy default stream and the blocking streams are ordered after each other's earlier work
        if self.non_blocking:
            return
        if self.ptr == 0:
            others = [s for s in list(Stream._live) if s.ptr != 0 and not s.non_blocking]
        else:
            others = [Stream.null]
        for s in others:
            pos = s._issued
            if pos > s._done and pos > self._seen.get(s, 0):
                self._seen[s] = pos
                self._ops.append((_wait_for(s, pos), f"implicit wait for {s!r}"))
                self._issued += 1

    def _run_until(self, pos: int) -> None:
        with LOCK:
            if self._done >= pos:
                return
            if self._running:
                raise RuntimeError(f"CUDA emulation: cyclic dependency on {self!r}")
            self._running = True
            try:
                while self._done < pos:
                    fn, _ = self._ops.popleft()
                    try:
                        fn()
                    finally:
                        self._done += 1
                        fn = None  # (what it held may be reclaimed once the queue has run)
            finally:
                self._running = False
            reclaim()

    @property
    def pending(self) -> int:
        """Queued operations not run yet (an emulation-only attribute, for tests)."""
        return self._issued - self._done

    # -- the CuPy API -----------------------------------------------------------------------------
    def synchronize(self) -> None:
        if self._capture is not None:
            raise RuntimeError("cudaErrorStreamCaptureUnsupported: synchronize during stream capture")
        HOST_WAITS[0] += 1
        self._run_until(self._issued)

    def query(self) -> bool:
        return self._done >= self._issued

    @property
    def done(self) -> bool:
        return self.query()

    def wait_event(self, event: Event) -> None:
        """Work queued on this stream after this call runs after the work ``event`` recorded."""
        src, pos = event._stream, event._pos
        if src is None or src is self:
            return
        self._enqueue(_wait_for(src, pos), f"wait for {src!r} at {pos}")

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def use(self) -> Stream:
        _current.stack = [self]
        return self

    def __enter__(self) -> Stream:
        _stack().append(self)
        return self

    def __exit__(self, *exc) -> bool:
        _stack().pop()
        return False

    def begin_capture(self, mode=None) -> None:
        if self.ptr == 0:
            raise RuntimeError("cudaErrorStreamCaptureUnsupported: cannot capture the legacy default stream")
        self._capture = []

    def is_capturing(self) -> bool:
        return self._capture is not None

    def end_capture(self) -> Graph:
        ops, self._capture = self._capture or [], None
        return Graph(ops)


Stream.null = Stream(null=True)


class HostStream(Stream):
    """A stream whose work runs as soon as it is queued (after what it waits for): torch's
    stream when torch runs on the host."""

    eager = True

    def __init__(self):
        super().__init__(non_blocking=True)


class Graph:
    """``cupy.cuda.graph.Graph``: captured work, queued again in order by :meth:`launch`."""

    def __init__(self, ops):
        self.ops = list(ops)

    def upload(self, stream=None) -> None:
        pass

    def launch(self, stream: Stream | None = None) -> None:
        s = get_current_stream() if stream is None else stream
        for fn, label in self.ops:
            s._enqueue(fn, label)


class Event:
    """``cupy.cuda.Event``: a position in a stream's queue (and the time the stream reached it)."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.disable_timing = disable_timing
        self._stream: Stream | None = None
        self._pos = 0
        self._t: float | None = None
        self._generation = 0

    def record(self, stream: Stream | None = None) -> None:
        s = get_current_stream() if stream is None else stream
        with LOCK:
            self._generation += 1
            gen = self._generation
            self._t = None

            def stamp():
                if self._generation == gen:
                    self._t = time.perf_counter()

            s._enqueue(stamp, "event record")
            self._stream, self._pos = s, s._issued

    def synchronize(self) -> None:
        HOST_WAITS[0] += 1
        if self._stream is not None:
            self._stream._run_until(self._pos)

    def query(self) -> bool:
        return self._stream is None or self._stream._done >= self._pos

    @property
    def done(self) -> bool:
        return self.query()


def get_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two completed events (``cudaErrorNotReady`` before they ran)."""
    if start._t is None or end._t is None:
        raise RuntimeError("cudaErrorNotReady: an event has not completed (synchronize it first)")
    return (end._t - start._t) * 1e3


_current = threading.local()


def _stack() -> list:
    if not hasattr(_current, "stack"):
        _current.stack = []
    return _current.stack


def get_current_stream(device_id: int = -1) -> Stream:
    """This thread's current stream (the legacy default one unless a ``with stream:`` is open)."""
    st = _stack()
    return st[-1] if st else Stream.null


def external_stream(ptr: int, device_id: int = -1) -> Stream:
    """``cupy.cuda.ExternalStream``: the stream with handle ``ptr`` (1 is the legacy default stream)."""
    ptr = int(ptr)
    if ptr in (0, 1):
        return Stream.null
    with LOCK:
        s = Stream._by_ptr.get(ptr)
        return s if s is not None else Stream(ptr=ptr)


def synchronize_device() -> None:
    """``cudaDeviceSynchronize``: run every stream's queue."""
    for s in list(Stream._live):
        s.synchronize()


# -- memory kinds -----------------------------------------------------------------------------------


class _Ranges:
    """Address ranges of live allocations of one kind (pinned host or device).

    An allocation is reclaimed as CUDA's stream-ordered allocators (CuPy's per-stream pool, RMM's pool,
    ``cudaFreeAsync``) reclaim it: once no array refers to it *and* every queue has run the work issued
    before, not at the moment its last array goes.  A kernel queued before then (a gather reaching a ring
    through a table of pointers, a copy into it) may still read or write it, as on a GPU; freeing its host
    buffer at once would let that work scribble on memory the host has reused.
    """

    def __init__(self):
        self._r: dict[int, int] = {}
        self._held: dict[int, object] = {}  # start -> the buffer, kept until reclaimed

    def add(self, owner, start: int, nbytes: int) -> None:
        """A range that lives as long as ``owner`` and the work queued before it went (None: until
        :meth:`remove`)."""
        self._r[start] = start + nbytes
        if owner is not None:
            self._held[start] = owner
            reclaim()

    def _reclaim(self) -> None:
        for start in list(self._held):
            if sys.getrefcount(self._held[start]) <= 2:  # the dict's and getrefcount's argument: nothing else
                del self._held[start]
                self._r.pop(start, None)

    def remove(self, start: int) -> bool:
        return self._r.pop(start, None) is not None

    def overlaps(self, start: int, nbytes: int) -> bool:
        return any(a < start + nbytes and start < b for a, b in list(self._r.items()))

    def __contains__(self, ptr: int) -> bool:
        return any(a <= ptr < b for a, b in list(self._r.items()))


PINNED = _Ranges()
DEVICE = _Ranges()


def reclaim() -> None:
    """Reclaim the allocations no array refers to, once no queue holds work issued before (see :class:`_Ranges`)."""
    with LOCK:
        if all(s._done >= s._issued for s in list(Stream._live)):
            PINNED._reclaim()
            DEVICE._reclaim()


def is_pinned(ptr: int) -> bool:
    return ptr in PINNED
