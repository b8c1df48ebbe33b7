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

import threading
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from .errors import SpecError
from .sample import SampleBatch, SampleBuffers

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .distributed.api import DistributedTable
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
        Requests in flight (positive).
    num_batches : int, optional
        Stop after this many (default: endless).
    seed : int, optional
        Base seed; rank ``r`` draws from ``SeedSequence([seed, r])``, one
        generator per request in flight (fresh entropy when None).
    rank, world_size : int, optional
        Default: from ``torch.distributed`` when initialised, else 0 / 1.
    timeout : float, optional
        Seconds each request may wait for the rate limiter (None: the
        table's own timeout, config ``table.timeout``).
    copy : bool, default False
        Yield batches that own their memory (otherwise a local table's
        batches view ``prefetch + 2`` buffers used in turn: keep a batch past
        the next ``prefetch + 1`` only as a copy).
    as_tensordict : bool, default False
        Yield ``tensordict.TensorDict`` objects (:meth:`SampleBatch.to_tensordict
        <gear_flow.SampleBatch.to_tensordict>`, TorchRL's key names) instead of
        :class:`~gear_flow.SampleBatch` (needs the ``tensordict`` extra).
    priority_backlog : int, optional
        Priority writes (:meth:`update_priorities`) pending before the next
        one waits; None (default): never wait.

    Examples
    --------
    >>> for batch in Stream(table, batch_size=256, length=64, prefetch=4, num_batches=100):  # doctest: +SKIP
    ...     loss = model(batch["obs"]).mean()
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
    ):
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise SpecError(f"prefetch ({prefetch!r}) must be a positive integer")
        self.table = table
        self.batch_size = batch_size
        self.length = length
        self.columns = tuple(
            table.spec.names if columns is None else ((columns,) if isinstance(columns, str) else columns)
        )
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

    def _rngs(self):
        base = np.random.SeedSequence(None if self.seed is None else [self.seed, self.rank])
        return [np.random.default_rng(s) for s in base.spawn(self.prefetch)]

    def __iter__(self):
        gen = self._batches()
        self._iters.add(gen)
        return gen

    def _batches(self):
        # a remote table's batches arrive in fresh frames: reusable buffers would only add a copy
        fresh = getattr(self.table, "returns_fresh_batches", False)
        shards = getattr(self.table, "shards", None)  # a LocalTable: its buffers live on the shards' tier
        tier = shards[0].tier if shards else "host"
        pool = [
            None if fresh else SampleBuffers(self.table.spec, self.columns, self.batch_size, self.length, tier=tier)
            for _ in range(self.prefetch + 2)
        ]
        rngs = self._rngs()
        ex = ThreadPoolExecutor(self.prefetch, thread_name_prefix="gear-flow-stream")
        pending: deque = deque()
        issued = 0

        def request(buf, rng):
            return self.table.sample(
                self.batch_size,
                self.length,
                columns=self.columns,
                boundary=self.boundary,
                timeout=self.timeout,
                out=buf,
                rng=rng,
            )

        def more() -> bool:
            return self.num_batches is None or issued < self.num_batches

        def submit() -> None:
            # request i uses buffer i mod (prefetch + 2) and generator i mod prefetch: at most
            # `prefetch` requests are in flight, so no two of them share a generator
            nonlocal issued
            pending.append(ex.submit(request, pool[issued % len(pool)], rngs[issued % self.prefetch]))
            issued += 1

        try:
            while len(pending) < self.prefetch and more():
                submit()
            while pending and not self._closed:
                batch: SampleBatch = pending.popleft().result()
                if more():
                    submit()
                batch = _copy(batch) if self.copy else batch
                yield batch.to_tensordict() if self.as_tensordict else batch
        finally:
            for f in pending:
                f.cancel()
            ex.shutdown(wait=True, cancel_futures=True)
            flush = getattr(self.table, "flush", None)
            if flush is not None:  # samples served under an admission lease get counted now
                flush()

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
        from .writers.priorities import PriorityWriter, host_copy

        with self._writer_lock:
            w = self._writer
            defer = getattr(self.table, "defer_priorities", None)
            if defer is not None and (w is None or w.collect(wait=False) == 0):  # nothing queued before it
                k, p = host_copy(keys, np.int64), host_copy(priorities, np.float64)
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

        Call it from the thread that iterates (or after iterating).

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
        """This stream as a ``torch.utils.data.IterableDataset`` (use ``DataLoader(ds, batch_size=None)``).

        With ``num_workers > 0`` (distributed tables only) every loader worker
        attaches its own handle and draws with its own seed; together they
        yield ``num_batches`` batches.  See :mod:`gear_flow.stream_loader`.

        Returns
        -------
        torch.utils.data.IterableDataset
        """
        from .stream_loader import StreamDataset

        return StreamDataset(self)


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
