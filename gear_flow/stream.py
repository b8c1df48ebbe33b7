"""What a learner iterates: batches with requests in flight.

:class:`Stream` keeps ``prefetch`` sample requests in flight (threads; the
gathers release the GIL, the distributed table's requests run concurrently on
the workers) and yields :class:`~gear_flow.sample.SampleBatch` objects in
order.  Each batch is gathered into buffers from a pool of ``prefetch + 2``
sets, so there is no allocation per batch; a batch therefore stays valid until
the learner takes the second batch after it (one training step on it, while
the next is taken, is safe); pass ``copy=True`` to keep batches longer.

It works as a ``torch.utils.data.IterableDataset`` (:meth:`Stream.dataset`,
use ``DataLoader(ds, batch_size=None)``: batches are already batched), also
with ``num_workers > 0`` for a distributed table (see
:mod:`gear_flow.stream_loader`), and is rank-aware: under
``torch.distributed`` (or given ``rank=``) each rank draws with its own seed,
so ranks see independent batches of the same table.

Feeding a GPU.  Over a ``disk`` table each request first advises the
kernel of the windows it drew (``madvise(MADV_WILLNEED)``, see
:meth:`DiskTier.readahead <gear_flow.storage.disk.DiskTier.readahead>`), so
that their pages are read all at once rather than one page fault at a time,
and then gathers them.  With ``device="cuda:N"`` the columns, mask and
importance weights of each batch are gathered into one page-locked staging
buffer and reach the device by one asynchronous host-to-device copy of that
buffer, made on the request's thread on a copy stream; the learner's stream
waits for it (an event, no host synchronisation).  :meth:`Stream.stats`
reports how long the learner's ``next()`` blocked for each batch: near zero
when ``prefetch`` requests keep ahead of it.

A stream is a context manager: leaving the ``with`` block stops its requests
in flight and writes back the priorities given to
:meth:`Stream.update_priorities`, which never blocks the learner: on a
distributed table with a weighted sampler it stores the update to ride on the
stream's next sample (no request of its own, see
:meth:`DistributedTable.update_priorities
<gear_flow.distributed.DistributedTable.update_priorities>` with
``wait=False``); otherwise it queues it for a background thread that writes
updates in order (a :class:`~gear_flow.PriorityWriter`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from collections import deque
from concurrent.futures import CancelledError, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from . import backend
from .errors import GearFlowError, SpecError, TableClosedError
from .sample import SampleBatch, SampleBuffers
from .table.admission import WAIT_CANCELLED

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from .distributed.api import DistributedTable
    from .spec import TableSpec
    from .stream_loader import StreamDataset
    from .table.local import LocalTable


def _dist_rank() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return 0, 1


#: the cancel events of the streams not finished yet (what their waiting requests look at)
_LIVE_CANCELS: weakref.WeakSet[threading.Event] = weakref.WeakSet()
#: set once the interpreter exits (:func:`_cancel_live_streams`)
_EXITING = threading.Event()


def _cancel_live_streams() -> None:
    """At interpreter exit, before Python joins the threads (an unfinished stream still referenced is
    collected only after): a stream's request waiting for the limiter without a timeout held the exit for
    ever.  Each gives up at its next look at its event (:data:`~gear_flow.table.admission.CANCEL_TURN_S`)."""
    _EXITING.set()
    for cancel in list(_LIVE_CANCELS):
        cancel.set()


# (threading's own hook, the one concurrent.futures uses to stop its pools at exit: run before the threads are
# joined, and after this was registered, before concurrent.futures joins the request threads)
threading._register_atexit(_cancel_live_streams)


class Stream:
    """Iterate batches of a LocalTable or DistributedTable.

    Parameters
    ----------
    table : LocalTable or DistributedTable
        The table to sample from.
    batch_size, length : int
        ``B`` windows of ``L`` steps per batch (``length`` default 1).
    columns : str or sequence of str, optional
        Columns each batch carries (default: all of the table's).
    boundary : {"strict", "pad_tail", "pad_head"}, optional
        How windows meet episode ends (config ``table.boundary``, default
        ``"strict"``: only windows that fit in their episode).
    prefetch : int, default 2
        Requests in flight (positive).  The batches do not depend on it:
        request ``i`` draws with its own generator, and over a LocalTable
        requests enter the table in the order they were made (they take its
        locks in turn anyway), so that a seeded stream yields the same batches
        in the same order whatever its depth.  A DistributedTable's requests
        run concurrently on its workers.
    num_batches : int, optional
        Stop after this many (default: endless).
    seed : int, optional
        Base seed; request ``i`` of rank ``r`` draws with the ``i``-th child
        of ``SeedSequence([seed, r])`` (fresh entropy when None).
    rank, world_size : int, optional
        Default: from ``torch.distributed`` when initialised, else 0 / 1.
    timeout : float, optional
        Seconds each request may wait for the rate limiter (None: the
        table's own timeout, config ``table.timeout``).
    copy : bool, default False
        Yield batches that own their memory (otherwise a local table's
        batches view ``prefetch + 2`` buffers used in turn: a batch is valid
        until the learner takes the second batch after it; keep it longer
        only as a copy).
    as_tensordict : bool, default False
        Yield ``tensordict.TensorDict`` objects (:meth:`SampleBatch.to_tensordict
        <gear_flow.SampleBatch.to_tensordict>`, TorchRL's key names) instead of
        :class:`~gear_flow.SampleBatch` (needs the ``tensordict`` extra).
    priority_backlog : int, optional
        Priority writes (:meth:`update_priorities`) pending before the next
        one waits; None (default): never wait.
    readahead : bool, optional
        Advise the kernel of each batch's windows before gathering them
        (``madvise(MADV_WILLNEED)``, coalesced per column file): a cold batch
        is read all at once instead of a page fault at a time.  Default: on
        for a ``disk`` table (ignored by other tiers).  A few windows are
        probed first (``mincore``), so a batch already in the page cache
        costs a few system calls, not one per window.
    device : str or torch.device, optional
        ``"cuda"`` or ``"cuda:N"``: yield batches whose columns, ``mask`` and
        ``weights`` are on that GPU, each batch gathered into one page-locked
        staging buffer (a pool of ``prefetch + 2``) and sent by one
        asynchronous copy, ordered before the learner's work on torch's
        current stream; ``keys``, ``probabilities``, ``episode_ids``,
        ``timesteps``, ``priorities`` and ``times_sampled`` stay on the host.
        A :class:`~gear_flow.LocalTable` on a host-memory tier (``host``,
        ``shared``, ``disk``) only.  None or ``"cpu"`` (default): host batches.

    Raises
    ------
    SpecError
        ``prefetch`` not a positive integer, ``readahead`` not a bool, or a
        ``device`` that is not a CUDA device or ``"cpu"``, or given for a
        table whose batches are not gathered on this host.
    BackendUnavailableError
        ``device`` names CUDA and torch sees no usable CUDA device.

    Examples
    --------
    >>> for batch in Stream(table, batch_size=256, length=64, prefetch=4, num_batches=100):  # doctest: +SKIP
    ...     loss = model(batch["obs"]).mean()
    >>> stream = Stream(disk_table, 256, 64, prefetch=4, device="cuda:0")  # doctest: +SKIP
    >>> for batch in stream:  # doctest: +SKIP
    ...     loss = (model(batch["obs"]) * batch.weights).mean()  # on cuda:0, one copy per batch
    >>> stream.stats()["wait_p99_s"]  # doctest: +SKIP
    0.0001
    """

    def __init__(
        self,
        table: LocalTable | DistributedTable,
        batch_size: int,
        length: int = 1,
        *,
        columns: str | Sequence[str] | None = None,
        boundary: str | None = None,
        prefetch: int = 2,
        num_batches: int | None = None,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        timeout: float | None = None,
        copy: bool = False,
        as_tensordict: bool = False,
        priority_backlog: int | None = None,
        readahead: bool | None = None,
        device: str | torch.device | None = None,
    ):
        from .table.config import check_timeout
        from .table.validate import check_sample_args, sample_columns

        # every argument checked here, not at the first batch (nor, for a timeout, once in the table's line)
        check_sample_args(batch_size, length, table.boundary if boundary is None else boundary, table.spec.capacity)
        columns = sample_columns(table.spec, columns)
        check_timeout(timeout)
        for name, v in (("num_batches", num_batches), ("seed", seed)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
                raise SpecError(f"{name} ({v!r}) must be None or an integer >= 0")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise SpecError(f"prefetch ({prefetch!r}) must be a positive integer")
        if readahead is not None and not isinstance(readahead, (bool, np.bool_)):
            raise SpecError(f"readahead ({readahead!r}) must be True, False or None (on for a disk table)")
        shards = getattr(table, "shards", None)
        on_disk = bool(shards) and getattr(shards[0].tier, "name", None) == "disk"
        #: do this stream's requests advise their windows before gathering them?
        self.readahead = on_disk if readahead is None else bool(readahead)
        #: where batches are staged to (a CUDA ``torch.device``), or None: host batches
        self.device = _staging_device(device, table)
        self.table = table
        self.batch_size = batch_size
        self.length = length
        self.columns = tuple(columns)
        self.boundary = boundary
        self.prefetch = prefetch
        self.num_batches = num_batches
        self.timeout = timeout
        self.copy = copy
        r, w = _dist_rank()
        self.rank = r if rank is None else rank
        self.world_size = w if world_size is None else world_size
        self.seed = seed
        self.priority_backlog = priority_backlog
        self.as_tensordict = bool(as_tensordict)
        if self.as_tensordict:
            import tensordict  # noqa: F401  (fail here, not in the first batch)
        self._closed = False
        self._iters: weakref.WeakSet = weakref.WeakSet()  # generators running, closed by close()
        self._writer = None
        self._writer_lock = threading.Lock()
        self._deferred = 0  # updates stored to ride on the next sample
        self._waits = _Waits()

    def _seeds(self) -> np.random.SeedSequence:
        # request i draws with the i-th child: what it draws does not depend on how many are in flight
        return np.random.SeedSequence(None if self.seed is None else [self.seed, self.rank])

    def __iter__(self):
        if self._closed:  # (its requests would take a queue's items for no one)
            raise GearFlowError("this Stream is closed: make a new one to sample again")
        gen = self._batches()
        self._iters.add(gen)
        return gen

    def _batches(self):
        if self._closed:  # an iterator made before close() and first run after it: it takes nothing
            return
        entered = time.perf_counter()  # the learner's first next() is waiting from here
        # a remote table's batches arrive in fresh frames: reusable buffers would only add a copy
        fresh = getattr(self.table, "returns_fresh_batches", False)
        shards = getattr(self.table, "shards", None)  # a LocalTable: its buffers live on the shards' tier
        tier = shards[0].tier if shards else "host"
        B, L, n = self.batch_size, self.length, self.prefetch + 2
        staged = self.device is not None
        if staged:
            import torch

            dev = self.device if self.device.index is not None else torch.device("cuda", torch.cuda.current_device())
            pool = [_Staged(self.table.spec, self.columns, B, L, dev) for _ in range(n)]
            copies = torch.cuda.Stream(dev)  # H2D copies overlap the learner's kernels on its own stream
        else:
            pool = [None if fresh else SampleBuffers(self.table.spec, self.columns, B, L, tier=tier) for _ in range(n)]
        if getattr(self.table, "path", None) is not None or self.readahead:  # a disk table: on, or off if asked
            from .storage.disk import DiskTier

            advised = functools.partial(DiskTier.readahead, self.readahead)
        else:
            advised = contextlib.nullcontext
        seeds = self._seeds()
        ex = ThreadPoolExecutor(self.prefetch, thread_name_prefix="gear-flow-stream")
        pending: deque = deque()
        issued = 0
        # an in-process table takes its locks for a whole sample: requests in turn cost no concurrency, and
        # make the stream's batches the table's consecutive samples (a queue's items in order, whatever the depth)
        turns = _Turns() if shards and not fresh else None

        cancel = threading.Event()  # set on leaving: a request still waiting in an in-process table gives up
        _LIVE_CANCELS.add(cancel)  # (and at interpreter exit)

        def request(i, slot, rng, free):
            WAIT_CANCELLED.set(cancel)  # (this executor thread's context)
            if staged:
                slot.reuse()  # its page-locked memory may still be read by the copy of an earlier batch
            if turns is not None:
                turns.wait(i)
            try:
                with advised():
                    batch = self.table.sample(
                        B,
                        L,
                        columns=self.columns,
                        boundary=self.boundary,
                        timeout=self.timeout,
                        out=slot.buffers if staged else slot,
                        rng=rng,
                    )
            finally:
                if turns is not None:
                    turns.done(i)
            return slot.send(batch, copies, free) if staged else (batch, None)

        def more() -> bool:
            return self.num_batches is None or issued < self.num_batches

        def submit() -> None:
            # request i uses buffer i mod (prefetch + 2): at most `prefetch` requests are in flight and the
            # learner holds at most two batches, so no two of them share a buffer
            nonlocal issued
            free = None
            if staged:
                # request i's device buffer held batch i - prefetch - 2, which the learner may use until it
                # takes batch i - prefetch (now): its copy waits for the learner's work issued so far
                free = torch.cuda.Event()
                free.record(torch.cuda.current_stream(dev))
            rng = np.random.default_rng(seeds.spawn(1)[0])
            pending.append(ex.submit(request, issued, pool[issued % n], rng, free))
            issued += 1

        try:
            while len(pending) < self.prefetch and more():
                submit()
            while pending and not self._closed:
                batch, sent = pending.popleft().result()
                if more():
                    submit()
                if sent is not None:  # the learner's stream runs its work on the batch after the copy
                    torch.cuda.current_stream(dev).wait_event(sent)
                batch = _copy(batch) if self.copy else batch
                batch = batch.to_tensordict() if self.as_tensordict else batch
                self._waits.record(time.perf_counter() - entered)
                yield batch
                entered = time.perf_counter()
        finally:
            for f in pending:
                f.cancel()
            if turns is not None:  # a request waiting for the turn of a cancelled one gives up
                turns.close()
            # and one waiting for the limiter (a drained queue, no timeout) gives up, nothing taken, at its next
            # look at the event (admission.CANCEL_TURN_S)
            cancel.set()
            ex.shutdown(wait=True, cancel_futures=True)
            if staged:  # no copy may still read the staging buffers once they are freed
                copies.synchronize()
            # a distributed table's samples served under an admission lease get counted now; a LocalTable's
            # flush() is a disk table's durable write of its files (or an error on another tier): not the stream's
            flush = None if shards else getattr(self.table, "flush", None)
            # (not at interpreter exit: the client's event loop that would carry it is gone, and it would wait)
            if flush is not None and not _EXITING.is_set():
                try:
                    flush()
                except (TableClosedError, SpecError):  # (no disk flush asked: the table was closed or dropped)
                    pass  # nothing left to count them in, as a LocalTable's stream closed after its table

    def stats(self) -> dict:
        """How long the learner waited for its batches: the seconds each ``next()`` on this stream blocked.

        A wait runs from the learner asking for a batch to the batch being
        handed over (the first one's includes starting the stream); near zero
        when ``prefetch`` requests keep ahead of the learner.  Percentiles are
        over the last :data:`WAIT_HISTORY` batches, the rest over all.

        Returns
        -------
        dict
            ``batches`` (handed over, every iteration of the stream
            together), ``wait_s`` (total seconds), ``wait_mean_s``,
            ``wait_last_s`` (the last batch's), ``wait_p50_s``,
            ``wait_p99_s`` and ``wait_max_s``; NaN before the first batch.
        """
        return self._waits.stats()

    def wait_times(self) -> np.ndarray:
        """The seconds the learner waited for each of the last :data:`WAIT_HISTORY` batches, oldest first.

        Returns
        -------
        numpy.ndarray
            float64 ``[min(batches, WAIT_HISTORY)]`` (see :meth:`stats`).
        """
        return self._waits.recent()

    def update_priorities(self, keys: ArrayLike, priorities: ArrayLike) -> None:
        """Update priorities of the table without blocking (see ``priority_backlog``).

        On a distributed table whose sampler lets updates ride along
        (weighted, no heap ties, keys this stream sampled), the update is
        checked and stored here and the stream's next sample carries it: no
        request of its own.  Otherwise, or while updates queued earlier are
        still pending, it is queued for one background thread.  Either way
        updates reach the table in the order they were made; a failed one is
        raised by a later call or by :meth:`close`.

        Parameters
        ----------
        keys : array-like or torch.Tensor of int64
            Copied now (a batch's keys alias buffers that later batches reuse).
        priorities : array-like or torch.Tensor of float

        Returns
        -------
        None
        """
        from .writers.priorities import PriorityWriter, key_copy, priority_copy

        if self._closed:  # (a writer made now would run on, unclosed, and its failures reach no one)
            raise GearFlowError("this Stream is closed: update the table's priorities with table.update_priorities")
        with self._writer_lock:
            w = self._writer
            defer = getattr(self.table, "defer_priorities", None)
            if defer is not None and (w is None or w.collect(wait=False) == 0):  # nothing queued before it
                k, p = key_copy(keys), priority_copy(priorities)
                if k.shape == p.shape and defer(k, p):
                    self._deferred += 1
                    return
            if w is None:
                self._writer = PriorityWriter(self.table, backlog=self.priority_backlog)
        self._writer.update(keys, priorities)

    @property
    def priority_writes(self) -> dict:
        """The priority updates so far: ``applied`` and ``stale`` items of those written by the background
        thread, ``pending`` ones queued there, ``deferred`` updates stored to ride on a sample (their stale
        keys are counted in the table's ``stats["deferred_stale"]``)."""
        w = self._writer
        if w is None:
            return {"applied": 0, "stale": 0, "pending": 0, "deferred": self._deferred}
        return {"applied": w.applied, "stale": w.stale, "pending": w.pending, "deferred": self._deferred}

    def close(self) -> None:
        """Stop: requests in flight are cancelled or awaited, queued priority updates written.

        Call it from the thread that iterates (or after iterating).  Batches
        already drawn and not yet handed over (up to ``prefetch``) are dropped
        with the stream: on a table whose items go once (a Queue, a Stack,
        ``max_times_sampled``) their items are gone, as a Reverb client's
        in-flight samples are; a consumer that must see every item runs the
        stream to its ``num_batches``.

        Returns
        -------
        None
        """
        self._closed = True
        for gen in list(self._iters):
            gen.close()  # runs the generator's cleanup: cancel what has not started, wait for the rest
        if self._writer is not None:
            self._writer.close(wait=True)
        if self._deferred:  # updates stored after the last batch: no sample will carry them
            self.table.flush()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def dataset(self) -> StreamDataset:
        """This stream as a ``torch.utils.data.IterableDataset``: ``DataLoader(ds, batch_size=None,
        collate_fn=gear_flow.stream_loader.as_is)``, or :meth:`loader`.

        With ``num_workers > 0`` (distributed tables only) every loader worker
        attaches its own handle and draws with its own seed; together they
        yield ``num_batches`` batches.  See :mod:`gear_flow.stream_loader`.

        Returns
        -------
        torch.utils.data.IterableDataset
        """
        from .stream_loader import StreamDataset

        return StreamDataset(self)

    def loader(self, num_workers: int = 0, **kwargs: Any) -> torch.utils.data.DataLoader:
        """A ``torch.utils.data.DataLoader`` of :meth:`dataset`, each batch handed over as the stream made it.

        Its ``collate_fn`` is :func:`~gear_flow.stream_loader.as_is`: torch's
        default for ``batch_size=None`` rebuilds every mapping it is given,
        which a ``TensorDict`` (``as_tensordict=True``) does not survive.

        Parameters
        ----------
        num_workers : int, default 0
            Loader processes (distributed tables only; see :meth:`dataset`).
        **kwargs
            Other ``DataLoader`` arguments (``pin_memory``, ``prefetch_factor``
            ...); not ``batch_size`` nor ``collate_fn``.  Without a
            ``multiprocessing_context`` the loader's workers start as Dask
            starts its own processes (``distributed.worker.multiprocessing-method``,
            ``spawn`` by default), not forked: this process has threads
            (the Dask client's event loop, the stream's), and a fork copies
            whatever lock one of them holds, held for ever in the child.

        Returns
        -------
        torch.utils.data.DataLoader

        Raises
        ------
        SpecError
            ``num_workers > 0`` for a :class:`~gear_flow.LocalTable`: refused
            here, not from inside a loader worker at the first batch.
        """
        import torch.utils.data

        from .stream_loader import as_is, worker_start_method

        dataset = self.dataset()
        dataset.check_workers(num_workers)
        if num_workers > 0 and kwargs.get("multiprocessing_context") is None:
            kwargs["multiprocessing_context"] = worker_start_method()
        return torch.utils.data.DataLoader(
            dataset, batch_size=None, collate_fn=as_is, num_workers=num_workers, **kwargs
        )


def _copy(b: SampleBatch) -> SampleBatch:
    return SampleBatch(
        {k: v.clone() for k, v in b.data.items()},
        b.keys.clone(),
        b.probabilities.clone(),
        b.weights.clone(),
        b.mask.clone(),
        b.episode_ids.clone(),
        b.timesteps.clone(),
        b.table_size,
        b.length,
        None if b.priorities is None else b.priorities.clone(),
        None if b.times_sampled is None else b.times_sampled.clone(),
    )


class _Turns:
    """Requests of a stream enter the table in the order they were made: request ``i`` after ``i - 1``'s sample
    returned (or raised).  Closing lets the waiting ones give up (their predecessors were cancelled)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._closed = False

    def wait(self, i: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._next == i or self._closed)
            if self._closed:
                raise CancelledError

    def done(self, i: int) -> None:
        with self._cond:
            self._next = i + 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


#: batches whose waits :meth:`Stream.stats` keeps for its percentiles (8 bytes each)
WAIT_HISTORY = 65536


class _Waits:
    """The seconds the learner's ``next()`` blocked, per batch: totals over all, the last :data:`WAIT_HISTORY`
    kept for percentiles.  Written by the iterating thread, read by any (its lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recent = np.zeros(WAIT_HISTORY)
        self._count = 0
        self._total = 0.0
        self._max = 0.0
        self._last = float("nan")

    def record(self, seconds: float) -> None:
        with self._lock:
            self._recent[self._count % WAIT_HISTORY] = seconds
            self._count += 1
            self._total += seconds
            self._max = max(self._max, seconds)
            self._last = seconds

    def recent(self) -> np.ndarray:
        with self._lock:
            k = self._count % WAIT_HISTORY
            if self._count < WAIT_HISTORY:  # (at exactly WAIT_HISTORY, k is 0 and the buffer is full)
                return self._recent[:k].copy()
            return np.concatenate([self._recent[k:], self._recent[:k]])

    def stats(self) -> dict:
        w = self.recent()
        with self._lock:
            n, total, top, last = self._count, self._total, self._max, self._last
        nan = float("nan")
        p50, p99 = (float(v) for v in np.percentile(w, [50, 99])) if n else (nan, nan)
        return {
            "batches": n,
            "wait_s": total,
            "wait_mean_s": total / n if n else nan,
            "wait_last_s": last,
            "wait_p50_s": p50,
            "wait_p99_s": p99,
            "wait_max_s": top if n else nan,
        }


def _staging_device(device: object, table: object) -> torch.device | None:
    """``Stream(device=)`` checked: a CUDA ``torch.device``, or None for host batches."""
    if device is None:
        return None
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise SpecError(f"device ({device!r}) is not a torch device; pass 'cuda', 'cuda:N' or 'cpu'") from None
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise SpecError(f"device ({device!r}) must be a CUDA device ('cuda', 'cuda:N') or 'cpu'")
    shards = getattr(table, "shards", None)
    if getattr(table, "returns_fresh_batches", False) or not shards:
        raise SpecError(
            f"device={device!r} stages the batches a LocalTable gathers in this process; this table's arrive from "
            "its workers: move them with batch.to(device)"
        )
    tier = backend.tier_name(shards[0].tier)
    if backend.output_on_device(tier):
        raise SpecError(f"device={device!r} stages host batches; this table's {tier!r} tier gathers on its GPU already")
    if not torch.cuda.is_available():
        raise _CudaUnavailable(f"Stream(device={device!r})", "torch sees no CUDA device")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise SpecError(f"device ({device!r}) is not one of the {torch.cuda.device_count()} CUDA devices here")
    return dev


class _CudaUnavailable(backend.BackendUnavailableError):
    """:class:`~gear_flow.backend.BackendUnavailableError` for torch's CUDA (the base names CuPy's)."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        RuntimeError.__init__(self, f"{what} needs a CUDA build of torch and a usable CUDA device: {reason}")


#: byte alignment of each array in a staging buffer (a device view of any dtype starts aligned)
_ALIGN = 256


def _layout(spec: TableSpec, columns: Sequence[str], B: int, L: int) -> tuple[list, int]:
    """``([(start, stop) of each column's bytes, of the mask's, of the weights'], size)`` in a batch's one
    staging buffer, each start a multiple of :data:`_ALIGN`."""
    sizes = [B * L * max(spec.column(name).nbytes, 1) for name in columns] + [B * L, 4 * B]
    spans, at = [], 0
    for size in sizes:
        at = -(-at // _ALIGN) * _ALIGN
        spans.append((at, at + size))
        at += size
    return spans, at


class _Staged:
    """One slot of a device stream's pool: a batch's columns, mask and weights in one page-locked host buffer
    (what the table gathers into, through :attr:`buffers`) and its device twin (what the learner reads), with
    the event after the copy that last read the host buffer.  ``device`` may be the CPU (no page-locking, no
    streams: the layout and views alone, as the tests check them without a GPU)."""

    def __init__(self, spec: TableSpec, columns: Sequence[str], batch_size: int, length: int, device: torch.device):
        import torch

        B, L = int(batch_size), int(length)
        spans, nbytes = _layout(spec, columns, B, L)
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
        self.dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
        raw = self.host.numpy()
        host = [raw[a:b] for a, b in spans]

        def dev(k: int, dtype: np.dtype):
            a, b = spans[k]
            return self.dev[a:b].view(torch.from_numpy(np.empty(0, dtype)).dtype)

        parts = {
            "data": {name: host[k].reshape(B, L, -1) for k, name in enumerate(columns)},
            "mask": host[-2].view(np.bool_).reshape(B, L),
            "weights": host[-1].view(np.float32),
            "keys": np.empty(B, dtype=np.int64),
            "probabilities": np.empty(B, dtype=np.float64),
            "episode_ids": np.empty(B, dtype=np.int64),
            "timesteps": np.empty(B, dtype=np.int64),
        }
        #: what the table gathers into: host arrays, the columns, mask and weights over the one host buffer
        self.buffers = SampleBuffers.wrap(spec, columns, L, parts)
        cols = [spec.column(name) for name in columns]
        self.data = {c.name: dev(k, c.dtype).view(B, L, *c.shape) for k, c in enumerate(cols)}
        self.mask = dev(-2, np.bool_).view(B, L)
        self.weights = dev(-1, np.float32)
        self.done = None  # event after the copy that last read self.host

    def reuse(self) -> None:
        """Wait (on the host) for the copy that last read the host buffer: it is about to be gathered into."""
        if self.done is not None:
            self.done.synchronize()

    def send(self, batch: SampleBatch, copies, free) -> tuple[SampleBatch, object]:
        """Copy the host buffer (``batch``, gathered into :attr:`buffers`) to the device, on stream ``copies``
        after event ``free``: ``(the device batch, the event after the copy)``."""
        import torch

        with torch.cuda.stream(copies):
            if free is not None:
                copies.wait_event(free)
            self.dev.copy_(self.host, non_blocking=True)  # the batch's one host-to-device copy
            self.done = torch.cuda.Event()
            self.done.record(copies)
        return self.device_batch(batch), self.done

    def device_batch(self, batch: SampleBatch) -> SampleBatch:
        """``batch`` with its columns, mask and weights the device views (the other fields as they are)."""
        b = batch
        return SampleBatch(
            self.data, b.keys, b.probabilities, self.weights, self.mask, b.episode_ids, b.timesteps,
            b.table_size, b.length, b.priorities, b.times_sampled,
        )  # fmt: skip
