"""Priority write-back in the background, in order, without blocking the learner.

A learner computes new priorities for the batch it just trained on and should
go on with the next batch at once.  :class:`PriorityWriter` hands each update
to one background thread, so updates reach the table in the order they were
made (a later update of a key is never overwritten by an earlier one), and
the learner waits only when more than ``backlog`` updates are pending: it
then runs at most ``backlog`` updates ahead of its priorities.  Other calls
that must keep that order (publishing weights after the updates they
reflect) go through the same thread with :meth:`PriorityWriter.call`.

A failed write is raised in the learner's thread at its next ``update``,
``call``, ``collect`` or ``drain``, or by ``close``, never lost: ``close``
waits for every queued write, counts each, and raises the first failure
(naming how many more failed).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from ..errors import SpecError, TableClosedError
from ..table.validate import integer_keys, real_numbers

if TYPE_CHECKING:
    from ..distributed.api import DistributedTable
    from ..table.local import LocalTable


class PriorityWriter:
    """Ordered background writes of priorities (and other calls) to a table.

    Parameters
    ----------
    table : LocalTable or DistributedTable
        Anything with ``update_priorities(keys, priorities)``.
    backlog : int or None
        Pending writes allowed before :meth:`update` waits for the oldest;
        None: never wait (the queue grows while the table is slower).

    Attributes
    ----------
    applied, stale : int
        Items whose priority was set, and keys ignored because their item was
        gone (evicted), over the writes collected so far.

    Examples
    --------
    >>> with PriorityWriter(table, backlog=8) as pw:               # doctest: +SKIP
    ...     for batch in stream:
    ...         td = train(batch)
    ...         pw.update(batch.keys, td.abs() + 1e-3)              # returns at once
    """

    def __init__(self, table: LocalTable | DistributedTable, backlog: int | None = 8):
        if backlog is not None and (isinstance(backlog, bool) or not isinstance(backlog, int) or backlog < 0):
            raise SpecError(f"backlog ({backlog!r}) must be None or an integer >= 0")
        self.table = table
        self.backlog = backlog
        self.applied = 0
        self.stale = 0
        self._pending: deque[Future] = deque()
        self._lock = threading.Lock()
        self._ex = ThreadPoolExecutor(1, thread_name_prefix="gear-flow-priorities")
        self._closed = False

    @property
    def pending(self) -> int:
        """Writes submitted and not yet collected."""
        return len(self._pending)

    def update(self, keys: ArrayLike, priorities: ArrayLike) -> None:
        """Queue ``table.update_priorities(keys, priorities)``; returns without waiting (see ``backlog``).

        Parameters
        ----------
        keys : array-like of int64
            Copied now: a batch's keys may alias buffers the next sample reuses.
        priorities : array-like of float
            Copied now, same length as ``keys``.

        Returns
        -------
        None

        Raises
        ------
        InvalidDataError
            Keys that are not integers (refused as the table refuses them, not
            cast to another item's), or priorities that are not real numbers;
            nothing was queued.
        """
        k = key_copy(keys)
        p = priority_copy(priorities)
        if k.shape != p.shape:
            raise SpecError(f"{len(k)} keys but {len(p)} priorities; nothing was queued")
        self._submit(self.table.update_priorities, k, p)

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the background thread after every write queued before it.

        Parameters
        ----------
        fn : callable
        *args
            Its arguments (not copied).

        Returns
        -------
        None
        """
        self._submit(fn, *args)

    def _submit(self, fn, *args) -> None:
        if self._closed:
            raise TableClosedError("the priority writer is closed")
        with self._lock:
            self._pending.append(self._ex.submit(fn, *args))
        self.collect(wait=False)

    def collect(self, wait: bool = False) -> int:
        """Account for finished writes (oldest first); raise the first failed one.

        Parameters
        ----------
        wait : bool
            Wait for every pending write, else only until at most ``backlog`` are pending.

        Returns
        -------
        int
            Writes still pending.
        """
        while True:
            with self._lock:
                if not self._pending:
                    return 0
                head = self._pending[0]
                over = self.backlog is not None and len(self._pending) > self.backlog
                if not (head.done() or wait or over):
                    return len(self._pending)
                self._pending.popleft()
            r = head.result()  # waits if needed; raises a failed write here
            if hasattr(r, "applied") and hasattr(r, "stale"):
                self.applied += int(r.applied)
                self.stale += int(r.stale)

    def drain(self) -> None:
        """Wait for every pending write (raising the first failure).

        Returns
        -------
        None
        """
        self.collect(wait=True)

    def close(self, wait: bool = True) -> None:
        """Stop the thread: after the pending writes (``wait``) or dropping those not started.

        With ``wait``, every pending write is waited for and accounted for
        (``applied``, ``stale``), a failed one included, so nothing is left
        pending; then the first failure is raised.  A second ``close`` does
        nothing.

        Parameters
        ----------
        wait : bool
            Wait for every pending write, else cancel those not started
            (the one running still finishes).

        Returns
        -------
        None

        Raises
        ------
        Exception
            The first write that failed (``wait`` only), its message naming
            how many later writes failed as well, if any.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if wait:
                self._collect_all()
        finally:
            self._ex.shutdown(wait=True, cancel_futures=not wait)

    def _collect_all(self) -> None:
        """Collect every pending write, going on past failures; raise the first failure."""
        # close() is the learner's last chance to hear of a failed write: stopping at the first
        # one (as drain does) would leave the later writes uncounted and their failures unraised.
        failures: list[Exception] = []
        while True:
            try:
                self.collect(wait=True)  # pops a write before its result: each failure comes once
                break
            except Exception as e:
                failures.append(e)
        if failures:
            first = failures[0]
            if len(failures) > 1:
                _mention_more(first, failures[1:])
            raise first

    def __enter__(self) -> PriorityWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(wait=exc_type is None)


def _mention_more(first: Exception, more: list[Exception]) -> None:
    """Append to ``first``'s one-line message how many later writes failed as well, and the next one."""
    nxt = more[0]
    what = f"{len(more)} later write{'s' if len(more) > 1 else ''} failed as well, the next with {type(nxt).__name__}: {nxt}"
    what = " ".join(what.split())  # one line, whatever the later message holds
    if first.args and isinstance(first.args[0], str):
        # the same exception (type and attributes kept for handlers), its message extended
        first.args = (f"{first.args[0]} ({what})", *first.args[1:])
    else:
        first.add_note(what)


def key_copy(keys: ArrayLike) -> np.ndarray:
    """A flat int64 host copy of item keys, checked as a table checks them
    (:func:`~gear_flow.table.validate.integer_keys`).

    Parameters
    ----------
    keys : array_like or torch.Tensor
        Any shape; a tensor may be on a device.

    Returns
    -------
    numpy.ndarray
        1-D int64, owning its memory.

    Raises
    ------
    InvalidDataError
        Keys that are not integers.
    """
    return np.array(integer_keys(keys), copy=True)


def priority_copy(priorities: ArrayLike) -> np.ndarray:
    """A flat float64 host copy of priorities, checked as a table checks them
    (:func:`~gear_flow.table.validate.real_numbers`: numbers, none complex).

    Parameters
    ----------
    priorities : array_like or torch.Tensor
        Any shape; a tensor may be on a device.

    Returns
    -------
    numpy.ndarray
        1-D float64, owning its memory.

    Raises
    ------
    InvalidDataError
        Values that are not real numbers.
    """
    return np.array(real_numbers(priorities, "priorities"), copy=True).reshape(-1)
