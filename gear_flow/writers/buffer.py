"""What every writer shares: checking a step against the spec, and a growing buffer of rows.

:func:`check_step` validates one step (or, with ``lead=(N,)``, one step of N
environments) before anything is buffered, so a bad step leaves a writer as
it was.  :class:`StepBuffer` holds rows in growing NumPy arrays, one per
column (doubling, so appending is amortised O(1)).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..errors import HeldInterrupt, InterruptedInFlight, InvalidDataError
from ..interrupts import holds_interrupts, waited
from ..spec import TableSpec
from ..table.results import InsertResult
from ..table.validate import as_array, storable

if TYPE_CHECKING:
    from concurrent.futures import Future

T = TypeVar("T")

logger = logging.getLogger(__name__)


def check_step(spec: TableSpec, step: Mapping, lead: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
    """Every column of ``step`` as an array of shape ``lead + column.shape``, checked.

    Parameters
    ----------
    spec : TableSpec
        The table's columns.
    step : mapping of str to array-like
        Exactly the table's columns.
    lead : tuple of int
        Leading dimensions (``(N,)`` for one step of ``N`` environments).

    Returns
    -------
    dict of str to numpy.ndarray
        The values, not yet cast to the columns' dtypes.

    Raises
    ------
    InvalidDataError
        Wrong columns, shape, a non-numeric value or a dtype that cannot be stored.
    """
    if not isinstance(step, Mapping):
        raise InvalidDataError(
            f"a step must be a mapping of column -> value, got {type(step).__name__}; nothing was appended"
        )
    names = set(spec.names)
    if set(step) != names:
        raise InvalidDataError(
            f"step columns {sorted(step)} do not match the table's {sorted(names)}; nothing was appended"
        )
    vals = {}
    for c in spec.columns:
        where = f"step column {c.name!r}"
        v = as_array(step[c.name], where)  # ragged nesting etc.: reported as bad data
        if v.dtype.kind not in "biufc":
            raise InvalidDataError(f"{where}: dtype {v.dtype} is not numeric; nothing was appended")
        if v.shape != (*lead, *c.shape):
            raise InvalidDataError(f"{where}: shape {v.shape} must be {(*lead, *c.shape)}; nothing was appended")
        try:  # an insert's rule: a value the cast would change (wrap round, overflow) is refused
            storable(v, c.dtype, where)
        except InvalidDataError as e:
            raise InvalidDataError(f"{e}; nothing was appended") from None
        vals[c.name] = v
    return vals


class StepBuffer:
    """Rows of one episode (or chunk) in growing arrays, one per column.

    Parameters
    ----------
    spec : TableSpec
        The table's columns (one array each, of the column's dtype).
    initial : int, default 64
        Rows allocated at first; capacity doubles when full.
    """

    def __init__(self, spec: TableSpec, initial: int = 64):
        self.arrays = {c.name: np.empty((initial, *c.shape), dtype=c.dtype) for c in spec.columns}
        self.n = 0

    def append(self, values: Mapping[str, np.ndarray]) -> None:
        """Add one row of checked values.

        Parameters
        ----------
        values : mapping of str to numpy.ndarray
            Every column to one row, as :func:`check_step` returned it (cast
            to the column's dtype on assignment).
        """
        first = next(iter(self.arrays.values()))
        if self.n == len(first):
            for k, a in self.arrays.items():
                b = np.empty((2 * len(a), *a.shape[1:]), dtype=a.dtype)
                b[: self.n] = a[: self.n]
                self.arrays[k] = b
        for k, v in values.items():
            self.arrays[k][self.n] = v
        self.n += 1

    def rows(self, stop: int | None = None) -> dict[str, np.ndarray]:
        """Views of the first ``stop`` rows.

        Parameters
        ----------
        stop : int, optional
            Rows to view (default: all).

        Returns
        -------
        dict of str to numpy.ndarray
            Column to a view of its first ``stop`` rows, valid until the next
            change to the buffer (copy to keep).
        """
        stop = self.n if stop is None else stop
        return {k: a[:stop] for k, a in self.arrays.items()}

    def keep_last(self, k: int) -> None:
        """Keep only the last ``k`` rows, moved to the front (overlapping windows carry them over).

        Parameters
        ----------
        k : int
            Rows to keep (all of them when ``k`` exceeds the count).
        """
        k = min(k, self.n)
        for a in self.arrays.values():
            a[:k] = a[self.n - k : self.n].copy()
        self.n = k

    def clear(self) -> None:
        """Drop every row."""
        self.n = 0


class BufferedWriter:
    """Lifecycle shared by the writers: ``close`` flushes, a ``with`` block that raises discards.

    Subclasses set ``self._closed = False`` and implement ``_flush()`` (insert what
    is pending) and ``discard()`` (drop it; returns how much); ``_unit`` names what
    ``discard`` counts in the warning.
    """

    _unit = "steps"
    _closed: bool
    _went_on: KeyboardInterrupt | None = None  # an insert's interrupt that came as it stored (:meth:`_table_insert`)
    _in_flight: Future | None = None  # the end of an insert interrupted again while it was awaited
    _unsettled: tuple | None = None  # that end, and the store that made it (:meth:`_settle`)
    _replayed: InsertResult | None = None  # that insert's result, for the store settling it

    def _target(self, table, shard: int | None, timeout: float | None) -> None:
        """The table the writer inserts into, and the ``shard`` and ``timeout`` of its inserts, checked now
        as the insert would check them: not when the first insert, with steps already buffered, fails.

        Parameters
        ----------
        table : LocalTable or DistributedTable
            The table.
        shard : int or None
            Every insert's shard.
        timeout : float or None
            Every insert's timeout.

        Raises
        ------
        SpecError
            A shard the table does not have, or a timeout that is not one.
        """
        from ..table.config import check_timeout
        from ..table.routing import check_shard

        self.table = table
        self.spec = table.spec
        self.shard = None if shard is None else check_shard(shard, table.spec.num_shards)
        self.timeout = check_timeout(timeout)

    def _flush(self) -> None:  # pragma: no cover - abstract by intent
        raise NotImplementedError

    def _stored(self, store: Callable[..., T], *args: Any) -> T:
        """``store(*args)``: an insert (:meth:`_table_insert`) and the buffer's letting go of what it stored, as one
        section (:func:`~gear_flow.interrupts.holds_interrupts`): an interrupt landing between the two (or held
        by the insert) comes once the buffer let go, a HeldInterrupt, where one landing there left the rows for
        a retry to store twice.  A distributed table's blocking insert stays as quick to interrupt while it
        waits (its waits let interrupts in, :func:`~gear_flow.interrupts.lets_in`); one interrupted where it
        goes on in the background is waited for by :meth:`_table_insert`, and its interrupt raised here once
        the buffer let go of what it stored (a HeldInterrupt, as a section's)."""
        self._went_on = None
        try:
            out = self._stored_held(store, *args)
        except KeyboardInterrupt:
            if self._in_flight is not None:  # its end not known yet: the writer's next call settles it
                self._unsettled = (self._in_flight, store, args)
            raise
        finally:
            self._in_flight = None
        if self._went_on is not None:
            interrupt, self._went_on = self._went_on, None
            raise HeldInterrupt(out) from interrupt
        return out

    def _table_insert(self, *args: Any, **kwargs: Any) -> InsertResult:
        """The table's ``insert(*args, **kwargs)``.  Interrupted where the insert goes on in the background (a
        distributed table's, :class:`~gear_flow.errors.InterruptedInFlight`), it waits for the insert's end:
        stored, it returns its result, so that the writer lets go of the rows it stored, and :meth:`_stored`
        raises the interrupt after; not stored, the interrupt comes now, the rows kept for a retry.  A
        HeldInterrupt (the insert stored) is raised after the same way.  Interrupted again while it waits, the
        interrupt comes at once and the writer's next call waits for that end first (:meth:`_settle`)."""
        if self._replayed is not None:  # (settling) the insert of these rows ended in the background: its result
            res, self._replayed = self._replayed, None
            return res
        try:
            return self.table.insert(*args, **kwargs)
        except HeldInterrupt as e:  # (a distributed table's, held to the end of its steps) stored
            self._went_on = e
            return e.result
        except InterruptedInFlight as e:
            try:
                res = waited(e.outcome)  # (in the section of :meth:`_stored`: a second interrupt still comes)
            except KeyboardInterrupt:  # a second interrupt: the first comes, the insert's end still to be known
                self._in_flight = e.outcome
                raise e from None
            except BaseException:  # noqa: BLE001 - not stored (cancelled, failed): the rows kept for a retry
                raise e from None
            self._went_on = e
            return res

    def _settle(self) -> None:
        """Before any other step of a writer whose insert was interrupted twice (:meth:`_table_insert`), that
        insert's end: stored, the store that made it lets go of the rows it stored (its insert answered by
        the result), as it would have had the wait not been interrupted; not stored, the rows stay for a
        retry.  Without it a retry stored them twice.  Interrupted while it waits, it stays to settle."""
        if self._unsettled is None:
            return
        end, store, args = self._unsettled
        try:
            res = end.result()
        except KeyboardInterrupt:
            raise
        except BaseException:  # noqa: BLE001 - not stored (cancelled, failed): nothing to let go of
            self._unsettled = None
            return
        self._unsettled, self._replayed = None, res
        try:
            self._stored_held(store, *args)  # (a section, as the store it finishes)
        finally:
            self._replayed = None

    def _buffered_after(self, first: Callable[[], object] | None, buffer: Callable[..., None], *args: Any) -> None:
        """``first()`` (an append's insert of what an earlier one left: an ended episode, a full chunk), then
        ``buffer(*args)`` (the append's own step).  ``first`` failing, nothing is buffered (the append raises
        with nothing appended); interrupted once it stored (a HeldInterrupt: the call is done when it comes),
        the step is buffered before the interrupt comes, else it was left out for nobody to retry."""
        if first is not None:
            try:
                first()
            except HeldInterrupt:
                buffer(*args)
                raise
        buffer(*args)

    @holds_interrupts
    def _stored_held(self, store: Callable[..., T], *args: Any) -> T:
        return store(*args)

    def discard(self) -> int:  # pragma: no cover - abstract by intent
        """Drop what is pending without inserting it.

        Returns
        -------
        int
            How much was dropped, in :attr:`_unit`.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Insert what is pending and refuse further appends.

        A close whose insert fails (the limiter timed out, the table refused it) raises and leaves the
        writer open with what it holds: a later ``close`` inserts it, or :meth:`discard` drops it.
        """
        self._settle()
        if not self._closed:
            self._flush()  # (closed only once it went in: a retried close would otherwise drop it unsaid)
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            n = self.discard()
            if n:
                logger.warning(
                    "writer exited with %s; %d buffered %s were not inserted", exc_type.__name__, n, self._unit
                )
            self._closed = True
        else:
            self.close()
