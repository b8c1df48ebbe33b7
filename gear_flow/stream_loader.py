"""A :class:`~gear_flow.Stream` as a ``torch.utils.data.IterableDataset``, loader workers included.

With ``stream.loader(num_workers=W)`` (``DataLoader(stream.dataset(),
batch_size=None, collate_fn=as_is, num_workers=W)``) each of the ``W`` loader
processes (spawned by default, as Dask starts its own; or forked) runs its own stream:

* it attaches its **own handle** to the distributed table, through its own
  ``distributed.Client`` to the table's scheduler (a handle, its client and
  their event loop never cross a process boundary);
* it draws with **its own seed**: ``SeedSequence([seed, rank, worker])``
  (fresh entropy per worker when ``seed`` is None);
* it yields its share of ``num_batches`` (together: ``num_batches``), as
  batches that own their memory (they travel to the main process through
  torch's shared memory).

What that means for a table whose items go out once (a Queue, a Stack,
``max_times_sampled``):

* the batches arrive in the order the ``DataLoader`` takes them from its
  workers (in turn), each worker's in its table's order: not the table's
  order across workers;
* a learner that stops early drops what is in flight, as
  :meth:`Stream.close <gear_flow.Stream.close>` drops its prefetched
  batches: each worker's ``prefetch`` requests and the loader's
  ``prefetch_factor`` batches per worker, whose items have left the table.

A :class:`~gear_flow.LocalTable` lives in the learner's process: loader
workers would sample a frozen copy of it, so ``num_workers > 0`` is refused
with one clear error; use ``num_workers=0`` (the stream already prefetches
with threads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch.utils.data

from .errors import SpecError

if TYPE_CHECKING:
    from .stream import Stream


def worker_start_method() -> str:
    """How :meth:`Stream.loader <gear_flow.Stream.loader>` starts its workers by default: as Dask starts its
    own processes (``distributed.worker.multiprocessing-method``; ``spawn`` without Dask's config).

    Returns
    -------
    str
        A ``multiprocessing`` start method.
    """
    try:
        import dask
        import distributed  # noqa: F401  (its config's defaults)
    except ImportError:
        return "spawn"
    return str(dask.config.get("distributed.worker.multiprocessing-method", "spawn"))


def as_is(batch: Any) -> Any:
    """A ``DataLoader``'s ``collate_fn`` that hands each batch over unchanged (torch's default for
    ``batch_size=None`` rebuilds every mapping, and fails on a ``TensorDict``).

    Parameters
    ----------
    batch : object
        A stream's batch.

    Returns
    -------
    object
        ``batch``.
    """
    return batch


#: Stream constructor arguments a loader worker copies from the learner's stream
_ARGS = ("batch_size", "length", "columns", "boundary", "prefetch", "timeout", "rank", "world_size", "as_tensordict")


class StreamDataset(torch.utils.data.IterableDataset):
    """The batches of a stream; see the module docstring.

    Parameters
    ----------
    stream : Stream
        The learner's stream (used as is when ``num_workers == 0``).
    """

    def __init__(self, stream: Stream):
        super().__init__()
        self.stream = stream
        table = stream.table
        client = getattr(table, "client", None)
        if client is not None:
            # what a loader worker needs to attach on its own: picklable, taken now in the learner's process
            self.attach = {"name": table.name, "address": client.scheduler.address, "security": client.security}
        else:
            self.attach = None
        self.args = {k: getattr(stream, k) for k in _ARGS}
        self.num_batches, self.seed = stream.num_batches, stream.seed

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["stream"] = None  # the learner's handle stays in the learner's process
        return state

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            return iter(self.stream)
        return self._in_worker(info.id, info.num_workers)

    def check_workers(self, num_workers: int) -> None:
        """Refuse ``num_workers > 0`` loader processes for a table that is not distributed.

        Parameters
        ----------
        num_workers : int
            The ``DataLoader``'s ``num_workers``.

        Returns
        -------
        None

        Raises
        ------
        SpecError
            ``num_workers > 0`` and the stream's table lives in this process
            (a :class:`~gear_flow.LocalTable`).
        """
        if self.attach is None and isinstance(num_workers, int) and num_workers > 0:
            raise SpecError(
                f"num_workers={num_workers}: a LocalTable cannot be read by DataLoader workers (each would sample "
                "a frozen copy of it); use num_workers=0 (the stream already prefetches with threads) or a "
                "DistributedTable"
            )

    def _in_worker(self, worker: int, workers: int):
        # a DataLoader made here (not by Stream.loader, which checks first) finds out in its worker
        self.check_workers(workers)
        from distributed import Client

        from .distributed import DistributedTable
        from .stream import Stream

        n = self.num_batches
        share = None if n is None else n // workers + (worker < n % workers)
        entropy = None if self.seed is None else [self.seed, self.args["rank"], worker]
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
        a = self.attach
        with Client(a["address"], security=a["security"], set_as_default=False) as client:
            table = DistributedTable.attach(a["name"], client=client, seed=seed)
            with Stream(table, **self.args, num_batches=share, seed=seed, copy=True) as stream:
                yield from stream
