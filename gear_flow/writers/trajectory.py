"""Streaming an episode in overlapping chunks, with items created where the caller says (Reverb's TrajectoryWriter).

An :class:`~gear_flow.EpisodeWriter` makes an episode sampleable only when it
ends.  :class:`TrajectoryWriter` inserts it in chunks of ``chunk_length``
rows as it is written; consecutive chunks share ``overlap`` rows (the last
rows of one chunk are the first rows of the next), so a window of up to
``overlap + 1`` steps that crosses a chunk boundary is still whole in the
next chunk.  Each chunk is one insert (all or nothing, the limiter's unit of
admission); the table stores it as an episode of its own.

Items (the keys that carry priorities and that sampling draws) are either
every stored row (``items="steps"``, the default: with an overlap, a shared
row is an item in both chunks that hold it) or only the starts the caller
creates (``items="created"``): after appending a step, ``create_item(length,
priority)`` makes the window of the last ``length`` steps an item, as Reverb's
``TrajectoryWriter.create_item`` does, for n-step transitions
(``length=n + 1`` after every step) or sequences every ``period`` steps.  The
other starts are stored with priority 0, which a ``Prioritized`` sampler never
draws while some item has weight; sample windows of the item's ``length``.
Keep the created items' priorities above 0 (a TD error plus a small epsilon):
once every priority is 0, the sampler draws uniformly over every stored start
(Reverb's rule for a table whose priorities are all 0), the others included.  Each created item is inserted
exactly once, in the chunk that holds its whole window.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InvalidDataError, InvalidPriorityError, SpecError, TableClosedError
from ..interrupts import holds_interrupts
from .buffer import BufferedWriter, StepBuffer, check_step

if TYPE_CHECKING:
    from ..distributed.api import DistributedTable
    from ..table.local import LocalTable

logger = logging.getLogger(__name__)

ITEMS = ("steps", "created")


def _table_config(table):
    from ..table.config import TableConfig

    cfg = getattr(table, "cfg", None)
    return cfg if isinstance(cfg, TableConfig) else getattr(table, "config", None)


class TrajectoryWriter(BufferedWriter):
    """Writes episodes as overlapping chunks; see the module docstring.

    Parameters
    ----------
    table : LocalTable or DistributedTable
        A table of step items.
    chunk_length : int
        Rows per insert (the last chunk of an episode may be shorter).
    overlap : int
        Rows a chunk shares with the next one, ``0 <= overlap < chunk_length``.
        With ``items="created"``, items may be at most ``overlap + 1`` steps long.
    items : {"steps", "created"}
        Every stored row is an item, or only the starts given to
        :meth:`create_item` (needs a ``Prioritized`` sampler with ``alpha >
        0``).  With ``"steps"`` and ``overlap > 0`` a shared row is stored in
        both chunks and is an item in both: sample ``strict`` windows of
        ``overlap + 1`` steps (its copy at the end of the earlier chunk holds
        no whole one) to draw each step once; a uniform draw of shorter
        windows favours the shared rows, and a Queue hands each of them out
        twice.  For items every step once, use ``overlap=0`` or ``"created"``.
    shard : int, optional
        Insert into this shard.
    timeout : float, optional
        Rate-limiter wait of each insert.

    Examples
    --------
    >>> import numpy as np
    >>> import gear_flow as gf
    >>> spec = gf.TableSpec((gf.ColumnSpec("obs", (2,)),), capacity=256)
    >>> table = gf.LocalTable(spec, sampler=gf.Prioritized(alpha=1.0))
    >>> with TrajectoryWriter(table, chunk_length=16, overlap=2, items="created") as w:
    ...     for t in range(40):
    ...         w.append({"obs": np.full(2, t)})
    ...         if w.episode_steps >= 3:
    ...             w.create_item(3, priority=1.0)  # a 3-step (2-step return) transition
    ...     w.end_episode()
    >>> int(table.sample(4, 3).mask.all())
    1
    """

    _unit = "rows"

    def __init__(
        self,
        table: LocalTable | DistributedTable,
        chunk_length: int,
        overlap: int = 0,
        *,
        items: str = "steps",
        shard: int | None = None,
        timeout: float | None = None,
    ):
        for name, v, lo in (("chunk_length", chunk_length, 1), ("overlap", overlap, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise SpecError(f"{name} ({v!r}) must be an integer >= {lo}")
        if overlap >= chunk_length:
            raise SpecError(f"overlap ({overlap}) must be smaller than chunk_length ({chunk_length})")
        if items not in ITEMS:
            raise SpecError(f"items {items!r} must be one of {ITEMS}")
        if table.spec.item_unit != "step":
            raise SpecError(f"a TrajectoryWriter needs a table of step items, not {table.spec.item_unit!r} items")
        if items == "created":
            from ..selectors import Prioritized

            sampler = getattr(_table_config(table), "sampler", None)
            if not (isinstance(sampler, Prioritized) and sampler.alpha > 0):
                raise SpecError(
                    f"items='created' needs a Prioritized sampler with alpha > 0 (got {sampler!r}): "
                    "the starts that are no item are stored with priority 0"
                )
        self._target(table, shard, timeout)
        self.chunk_length = chunk_length
        self.overlap = overlap
        self.items = items
        self._rows = StepBuffer(self.spec)
        self._prio: list[float | None] = []
        self._head = 0  # rows at the buffer's start that the previous chunk already inserted
        self._steps = 0
        self._closed = False
        #: (episode id in the table, rows) of every chunk inserted
        self.chunks: list[tuple[int, int]] = []

    # -- writing ----------------------------------------------------------------------------------
    @property
    def episode_steps(self) -> int:
        """Steps appended to the current episode (over all its chunks)."""
        return self._steps

    @property
    def pending(self) -> int:
        """Rows appended and not yet inserted."""
        return self._rows.n - self._head

    def append(self, step: Mapping, priority: float | None = None) -> None:
        """Add one step; a full chunk is inserted first (before this step) when one is waiting.

        Parameters
        ----------
        step : mapping of str to array-like
            Every column, one step's value.
        priority : float, optional
            With ``items="steps"``: this step's item priority (default: the
            table's, as for an insert without priorities, when no step of its
            chunk has one; else the largest given in the chunk, as one insert
            takes one priority per item or none).  Not allowed with
            ``items="created"`` (use :meth:`create_item`).

        Returns
        -------
        None
            A failed chunk insert (e.g. :class:`~gear_flow.RateLimitTimeout`)
            raises with nothing appended; the chunk stays buffered and the
            next ``append`` or :meth:`flush` retries it.  Interrupted once
            the chunk was stored (:class:`~gear_flow.errors.HeldInterrupt`),
            the step is appended too.
        """
        self._settle()
        if self._closed:
            raise TableClosedError("the writer is closed")
        if priority is not None and self.items == "created":
            raise SpecError("with items='created' priorities are given to create_item, not append")
        vals = check_step(self.spec, step)
        if priority is not None:
            try:
                p = float(priority)
            except (TypeError, ValueError):
                raise InvalidDataError(f"priority must be a number, got {priority!r}") from None
            if not np.isfinite(p) or p < 0:
                raise InvalidPriorityError(self._rows.n, p)
        self._buffered_after(self.flush if self._rows.n >= self.chunk_length else None, self._buffer, vals, priority)

    @holds_interrupts
    def _buffer(self, vals: dict, priority: float | None) -> None:
        """The step buffered with its priority, as one section (cut between the two, the chunk's priorities no
        longer matched its rows)."""
        self._rows.append(vals)
        self._prio.append(priority if self.items == "steps" else 0.0)
        self._steps += 1

    def create_item(self, length: int, priority: float = 1.0) -> None:
        """Make the window of the last ``length`` steps an item with ``priority``.

        Parameters
        ----------
        length : int
            ``1 <= length <= overlap + 1`` and at most :attr:`episode_steps`;
            right after a :meth:`flush`, at most the ``overlap`` rows it kept
            (the item's first steps went with that chunk: create it before).
        priority : float
            Its priority, ``> 0`` (0 would make it unsampleable).

        Returns
        -------
        None
        """
        self._settle()
        if self.items != "created":
            raise SpecError("create_item needs a writer made with items='created'")
        if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= self.overlap + 1:
            raise SpecError(f"item length ({length!r}) must be an integer in [1, overlap + 1 = {self.overlap + 1}]")
        if length > self._steps:
            raise SpecError(f"item length {length} exceeds the {self._steps} steps of the current episode")
        if length > len(self._prio):  # its first steps went with the last chunk, and only overlap rows were kept
            raise SpecError(
                f"item length {length} reaches before the {len(self._prio)} rows kept since the last flush: "
                "create the item before flushing"
            )
        try:
            p = float(priority)
        except (TypeError, ValueError):
            raise SpecError(f"item priority ({priority!r}) must be a finite number > 0") from None
        if not np.isfinite(p) or p <= 0:
            raise SpecError(f"item priority ({priority!r}) must be a finite number > 0")
        self._prio[len(self._prio) - length] = p

    def flush(self) -> None:
        """Insert the buffered rows as one chunk and keep its last ``overlap`` rows for the next.

        Returns
        -------
        None
            Nothing happens when no row was appended since the last chunk.
        """
        self._settle()
        if self.pending <= 0:
            return
        self._stored(self._chunk, self._rows.n)

    def _chunk(self, n: int) -> None:
        """The ``n`` buffered rows inserted as one chunk, its last ``overlap`` rows kept for the next."""
        self._insert(n)
        keep = min(self.overlap, n)
        self._rows.keep_last(keep)
        # created items among the kept rows went in with this chunk: in the next one they start none (yet)
        self._prio = [p if self.items == "steps" else 0.0 for p in self._prio[n - keep : n]]
        self._head = keep

    def _insert(self, n: int) -> None:
        prio = self._prio[:n]
        if all(p is None for p in prio):
            priorities = None
        elif any(p is None for p in prio):  # "steps" with some priorities given: the rest get the largest
            default = max(p for p in prio if p is not None)
            priorities = np.array([default if p is None else p for p in prio], dtype=np.float64)
        else:
            priorities = np.array(prio, dtype=np.float64)
        res = self._table_insert(self._rows.rows(n), priorities, timeout=self.timeout, shard=self.shard)
        self.chunks.append((int(res.episode_ids[0]), n))

    def end_episode(self) -> None:
        """Insert what is left of the episode (the last chunk); the next ``append`` starts a new one.

        Returns
        -------
        None
        """
        self._settle()
        self._stored(self._last_chunk)

    def _last_chunk(self) -> None:
        """What is left of the episode inserted, and the buffer emptied for the next."""
        # an item created on the rows kept since the last chunk goes in with them: they are its chunk
        if self.pending > 0 or (self.items == "created" and any(p > 0 for p in self._prio)):
            self._insert(self._rows.n)
        self._rows.clear()
        self._prio, self._head, self._steps = [], 0, 0

    def discard(self) -> int:
        """Drop the rows not yet inserted and end the episode there.

        Returns
        -------
        int
            Rows dropped.
        """
        self._settle()
        n = max(0, self.pending)
        self._rows.clear()
        self._prio, self._head, self._steps = [], 0, 0
        return n

    def _flush(self) -> None:
        self.end_episode()
