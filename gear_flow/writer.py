"""Streaming writer for actors: ``append(step)`` … ``end_episode()``.

Steps are buffered in the writer (growing NumPy arrays, one per column) and
become sampleable all at once when ``end_episode()`` returns: the episode is
inserted atomically, exactly like a one-episode ``insert``.  With
``max_episode_length`` set, an episode that reaches that many steps is ended
automatically (``truncated`` in :attr:`EpisodeWriter.ended`) and the next
``append`` starts a new one, so non-terminating environments still deliver data.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from .errors import InvalidDataError, SpecError, TableClosedError
from .interrupts import holds_interrupts
from .table.results import InsertResult
from .writers.buffer import BufferedWriter, StepBuffer, check_step

if TYPE_CHECKING:
    from .distributed.api import DistributedTable
    from .table.local import LocalTable

logger = logging.getLogger(__name__)


class EpisodeWriter(BufferedWriter):
    """Buffers one episode at a time and inserts it whole.

    Parameters
    ----------
    table : LocalTable or DistributedTable
        Anything with ``spec`` and ``insert(episodes, priorities, timeout=, shard=)``.
    max_episode_length : int, optional
        End the episode automatically at this many steps.
    shard : int, optional
        Insert into this shard (writer affinity).
    timeout : float, optional
        Seconds each insert may wait for the rate limiter (None: the table's own timeout).

    Examples
    --------
    >>> import numpy as np
    >>> from gear_flow import ColumnSpec, TableSpec, LocalTable
    >>> table = LocalTable(TableSpec((ColumnSpec("obs", (2,)),), capacity=100))
    >>> with table.writer() as w:
    ...     for t in range(3):
    ...         w.append({"obs": np.full(2, t)})
    ...     _ = w.end_episode()
    >>> table.size
    3
    """

    def __init__(
        self,
        table: LocalTable | DistributedTable,
        max_episode_length: int | None = None,
        shard: int | None = None,
        timeout: float | None = None,
    ):
        if max_episode_length is not None and (
            isinstance(max_episode_length, bool) or not isinstance(max_episode_length, int) or max_episode_length < 1
        ):
            raise SpecError(f"max_episode_length ({max_episode_length!r}) must be a positive integer or None")
        self._target(table, shard, timeout)
        self.max_episode_length = max_episode_length
        self._rows = StepBuffer(self.spec)
        self._prio: list[float] | None = None
        self._closed = False
        #: (episode_id, length, truncated) of every episode this writer ended (one open at close: truncated)
        self.ended: list[tuple[int, int, bool]] = []

    @property
    def _n(self) -> int:
        return self._rows.n

    @property
    def pending(self) -> int:
        """Steps appended to the current episode, not yet sampleable."""
        return self._n

    def append(self, step: Mapping, priority: float | None = None) -> None:
        """Add one step to the current episode.

        When the step completes ``max_episode_length`` and the automatic
        ``end_episode`` fails (e.g. :class:`~gear_flow.RateLimitTimeout`, or
        an interrupt), the error propagates but the step *was* appended; the
        full episode stays buffered and is inserted by the next ``append``
        (before it takes its step) or ``end_episode``.  That insert failing
        again, or interrupted before it stored, the ``append`` raises with
        nothing appended; interrupted once it stored
        (:class:`~gear_flow.errors.HeldInterrupt`), the step is appended.
        :attr:`pending` tells which.

        Parameters
        ----------
        step : mapping of str to array_like
            Every column of the table to one step's value (shape and dtype of
            the column's per-step spec).
        priority : float, optional
            This step's priority (finite, >= 0).  Steps without one get the
            largest given in the episode (step items) and an episode item
            gets the largest of its steps'; none at all: the table's default.

        Raises
        ------
        InvalidDataError
            ``step`` is not a mapping, misses a column or does not fit it, or
            ``priority`` is not a number; nothing was appended.
        InvalidPriorityError
            ``priority`` is negative or not finite; nothing was appended.
        TableClosedError
            The writer is closed.
        """
        self._settle()
        if self._closed:
            raise TableClosedError("the writer is closed")
        if not isinstance(step, Mapping):
            raise InvalidDataError(
                f"a step must be a mapping of column -> value, got {type(step).__name__}; nothing was appended"
            )
        # an automatic end failed earlier: that episode goes in first, so that no episode ever exceeds
        # max_episode_length (raising again, appending nothing); this step is checked before, as the first of
        # the next episode (refused after that insert's HeldInterrupt, it dropped the interrupt)
        catch_up = self.max_episode_length is not None and self._n >= self.max_episode_length
        vals = check_step(self.spec, step)
        if priority is not None:
            try:
                if isinstance(priority, (str, bytes)):  # (float() reads "9" as a number: text is not one)
                    raise TypeError(priority)
                p = float(priority)
            except (TypeError, ValueError):
                raise InvalidDataError(f"priority must be a number, got {priority!r}; nothing was appended") from None
            if not np.isfinite(p) or p < 0:
                from .errors import InvalidPriorityError

                raise InvalidPriorityError(0 if catch_up else self._n, p)
        self._buffered_after(functools.partial(self.end_episode, truncated=True) if catch_up else None, self._buffer,
                             vals, priority)  # fmt: skip
        if self.max_episode_length is not None and self._n >= self.max_episode_length:
            self.end_episode(truncated=True)

    @holds_interrupts
    def _buffer(self, vals: dict, priority: float | None) -> None:
        """The step buffered with its priority, as one section (cut between the two, the episode's priorities
        no longer matched its steps)."""
        if priority is not None or self._prio is not None:
            if self._prio is None:
                self._prio = [None] * self._n
            self._prio.append(priority)
        self._rows.append(vals)

    def end_episode(self, priorities: ArrayLike | float | None = None, truncated: bool = False) -> InsertResult | None:
        """Insert the buffered steps as one episode.

        On failure (e.g. a rate-limiter timeout) the steps stay buffered, so
        the call can be retried; interrupted once the episode was stored
        (:class:`~gear_flow.errors.HeldInterrupt`), none stay.

        Parameters
        ----------
        priorities : array_like or float, optional
            Per item (one per step for step items, one for an episode item),
            or one for all; overrides those given to :meth:`append`.
        truncated : bool, default False
            The episode was cut (time limit) rather than terminated; recorded
            in :attr:`ended`.

        Returns
        -------
        InsertResult or None
            The table's result for the insert (keys, episode id, shard); None
            when no step was buffered.
        """
        self._settle()
        if self._n == 0:
            return None
        ep = self._rows.rows(self._n)
        if priorities is None and self._prio is not None:
            if self.spec.item_unit == "step":
                default = max([p for p in self._prio if p is not None], default=1.0)
                priorities = np.array([default if p is None else p for p in self._prio])
            else:
                priorities = max(p for p in self._prio if p is not None)
        return self._stored(self._store, ep, priorities, truncated)

    def _store(self, ep: dict, priorities: ArrayLike | float | None, truncated: bool) -> InsertResult:
        res = self._table_insert(ep, priorities, timeout=self.timeout, shard=self.shard)
        self.ended.append((int(res.episode_ids[0]), self._n, truncated))
        self._rows.clear()
        self._prio = None
        return res

    def discard(self) -> int:
        """Drop the buffered steps of the current episode.

        Returns
        -------
        int
            How many steps were dropped.
        """
        self._settle()
        n, self._prio = self._n, None
        self._rows.clear()
        return n

    def _flush(self) -> None:
        # an episode still open when the writer closes was cut, not ended by its environment: truncated in
        # `ended`, as a VectorWriter's open episodes are at its close
        self.end_episode(truncated=True)
