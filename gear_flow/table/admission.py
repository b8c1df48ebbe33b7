"""Admission of an in-process table's calls: who may go ahead, in which order.

The rate limiter decides *whether* a call may go ahead; this module decides
*who* goes first and what size the limiter sees:

* **Admitted size.**  Inserts are admitted against the items stored *plus*
  the items of inserts admitted and still being written (Reverb counts an
  insert when it is admitted, as does the distributed coordinator's
  :class:`~gear_flow.distributed.gate.TableGate`).  An admitted insert writes
  after releasing the condition; without this count a second producer woken
  at the same time would still see the old size and be admitted too (a
  Queue of size 1 then holds two items and its remover drops one).
* **First come, first served, per kind.**  Blocked inserts are served in
  arrival order, and so are blocked samples (Reverb serves blocked calls so;
  the distributed gate does the same).  A call that is not at the head of its
  kind's line waits even if the limiter would admit it, so which items end up
  in a table does not depend on how threads are woken.

No I/O: a plain condition variable, tickets and two lines.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING

from ..errors import RateLimitTimeout, TableClosedError
from ..interrupts import deliver_held

if TYPE_CHECKING:
    from ..rate_limiters import RateLimiter

#: an event that, once set, makes this thread's waiting calls give up (``concurrent.futures.CancelledError``,
#: the call applied nothing): a caller that may abandon calls it made on another thread sets it there (a
#: Stream's prefetching requests, left blocked by a learner that stopped) and, to cancel them, sets the event.
#: Such a call looks at it at least every :data:`CANCEL_TURN_S` while it waits (a DistributedTable's between
#: turns of its wait at the coordinator), so that setting it is all the caller does
WAIT_CANCELLED: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "gear_flow_wait_cancelled", default=None
)

KINDS = ("insert", "sample")

#: seconds between two looks of a waiting call at its :data:`WAIT_CANCELLED` event
CANCEL_TURN_S = 0.25
#: how often a wait of the main thread (for the limiter, for a lock) raises an interrupt held meanwhile (s)
HELD_TURN_S = 0.05


class Admission:
    """Condition variable, per-kind FIFO lines of waiters, and the count of inserts in flight.

    Attributes
    ----------
    cond : threading.Condition
        The table's condition; every method but :meth:`check_open` and
        :meth:`waiting` is called holding it.
    closed : bool
        Set by :meth:`close`; every wait then raises TableClosedError.
    in_flight : int
        Items of admitted inserts not yet stored in the shards.
    arrivals : int
        Inserts stored so far (a batch short of items waits for the next).

    Examples
    --------
    >>> adm = Admission()
    >>> with adm.cond:
    ...     adm.wait("insert", lambda: True, None, lambda t: RuntimeError("late"))
    ...     adm.done("insert")
    """

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.closed = False
        #: items of admitted inserts not yet stored in the shards
        self.in_flight = 0
        #: inserts stored so far: a batch its items left could not fill waits for the next
        self.arrivals = 0
        self._tickets = itertools.count()
        self._lines: dict[str, deque] = {k: deque() for k in KINDS}

    def close(self) -> None:
        """Wake every waiter with :class:`TableClosedError` (call holding ``cond``)."""
        self.closed = True
        self.cond.notify_all()

    def check_open(self) -> None:
        """Raise :class:`TableClosedError` once the table is closed.

        Raises
        ------
        TableClosedError
            :meth:`close` was called.
        """
        if self.closed:
            raise TableClosedError("the table is closed")

    def wait(
        self,
        kind: str,
        pred: Callable[[], bool],
        timeout: float | None,
        timed_out: Callable[[float], Exception],
    ) -> None:
        """Wait (holding ``cond``) until this call heads its line and ``pred()`` holds.

        On return the call still heads its line: the caller applies its
        admission (limiter counts) and then calls :meth:`done`, both while
        holding ``cond``.  On timeout or close the call leaves its line and
        the next in line is woken.

        Parameters
        ----------
        kind : {"insert", "sample"}
            Which line to join.
        pred : callable
            ``pred() -> bool``: whether the limiter admits the call now;
            evaluated holding ``cond``, each time the call is woken.
        timeout : float or None
            Seconds to wait at most; None: forever.
        timed_out : callable
            ``timed_out(timeout) -> Exception``: the exception raised on
            timeout (see :func:`timeout_error`).

        Raises
        ------
        Exception
            ``timed_out(timeout)`` when the time ran out.
        TableClosedError
            The table was closed while waiting (or before).
        """
        line = self._lines[kind]
        ticket = next(self._tickets)
        line.append(ticket)
        try:  # (from here on the ticket leaves its line however this ends)
            deadline = None if timeout is None else time.monotonic() + timeout
            cancelled = WAIT_CANCELLED.get()
            # a table's call holds interrupts (a section): one held meanwhile is raised at the next turn, with
            # the lock held (let in while Condition.wait re-took the lock, it left that lock with another thread)
            turn = HELD_TURN_S if threading.current_thread() is threading.main_thread() else None
            if cancelled is not None:  # (set by its caller, who does not notify this condition)
                turn = CANCEL_TURN_S if turn is None else min(turn, CANCEL_TURN_S)
            while True:
                deliver_held()
                self.check_open()
                if cancelled is not None and cancelled.is_set():
                    raise CancelledError(f"a waiting {kind} was given up by its caller")
                if line[0] == ticket and pred():
                    return
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise timed_out(timeout)
                if turn is not None:
                    remaining = turn if remaining is None else min(remaining, turn)
                self.cond.wait(remaining)
        except BaseException:
            line.remove(ticket)
            self.cond.notify_all()
            raise

    def admit_now(self, kind: str, pred: Callable[..., bool], *args: object) -> bool:
        """Whether a call may go ahead at once, without joining its line (call holding ``cond``).

        True when the table is open, no call of ``kind`` is waiting (none is
        passed over) and ``pred()`` holds; the caller then applies its
        admission and does not call :meth:`done`.  False: it :meth:`wait` s.

        Parameters
        ----------
        kind : {"insert", "sample"}
            The call's line.
        pred : callable
            ``pred(*args) -> bool``: whether the limiter admits the call now.
        *args : object
            Its arguments.

        Returns
        -------
        bool
            Admitted.
        """
        return not self.closed and not self._lines[kind] and pred(*args)

    def done(self, kind: str) -> None:
        """The head of ``kind``'s line was admitted: the next one may go (call holding ``cond``).

        Parameters
        ----------
        kind : {"insert", "sample"}
            The line whose head leaves.
        """
        self._lines[kind].popleft()
        self.cond.notify_all()

    def wake(self) -> None:
        """Wake the waiting calls after a change that may admit one (call *not* holding ``cond``).

        Only a call in a line waits on ``cond``, and it joins its line and
        reads the state under ``cond``: one that joins after the change sees
        it, and one that joined before is in a line when this looks.  So
        with both lines empty there is no one to wake, and a steady state
        with no call blocked does not take ``cond`` once more per call.
        """
        if self._lines["insert"] or self._lines["sample"]:
            with self.cond:
                self.cond.notify_all()

    def admitted(self, n: int) -> None:
        """An insert of ``n`` items was admitted and is being written (call holding ``cond``): inserts
        admitted after it see its items in :attr:`in_flight`.

        Parameters
        ----------
        n : int
            Its items.
        """
        self.in_flight += int(n)

    def landed(self, n: int) -> None:
        """An admitted insert of ``n`` items finished writing, stored or not (call holding ``cond``): its
        items leave :attr:`in_flight` and it counts as an arrival (the table wakes its waiters once it
        has evicted to ``max_size``).

        Parameters
        ----------
        n : int
            Its items.
        """
        self.in_flight -= int(n)
        self.arrivals += 1

    def withdrawn(self, n: int) -> None:
        """An admitted insert of ``n`` items will not write after all (interrupted before it reached the
        shards): its items leave :attr:`in_flight`, and it is no arrival (call holding ``cond``).

        Parameters
        ----------
        n : int
            Its items.
        """
        self.in_flight -= int(n)

    def waiting(self, kind: str) -> int:
        """Calls of ``kind`` waiting now (including one being admitted).

        Parameters
        ----------
        kind : {"insert", "sample"}
            The line.

        Returns
        -------
        int
            Its length.
        """
        return len(self._lines[kind])


def timeout_error(what: str, limiter: RateLimiter, size: Callable[[], int]) -> Callable[[float], Exception]:
    """The :class:`RateLimitTimeout` a call raises when ``limiter`` did not admit it in time.

    Parameters
    ----------
    what : str
        The call, for the message (``"a sample of 32"``).
    limiter : RateLimiter
        The table's limiter; its repr and counts go in the message.
    size : callable
        ``size() -> int``: the table's size when the time ran out.

    Returns
    -------
    callable
        ``make(timeout) -> RateLimitTimeout``, as :meth:`Admission.wait`
        takes it; the message is built when the time runs out.
    """

    def make(timeout: float) -> Exception:
        return RateLimitTimeout(
            f"{what} was not admitted by {limiter!r} within {timeout} s "
            f"(table size {size()}, inserts {limiter.state.inserts}, samples {limiter.state.samples})"
        )

    return make


def acquire_all(locks: Sequence) -> None:
    """Acquire ``locks`` in order, all or none.

    An acquire that raises (a ``KeyboardInterrupt`` while it waits: a notebook's interrupt, a signal
    handler's exception) releases the locks already taken.  Without that the interrupted caller kept
    them for good, and every later call on those shards hung.

    Parameters
    ----------
    locks : sequence of lock
        In the order to take them (ascending shard ids: the one order every caller keeps).

    Examples
    --------
    >>> a, b = threading.RLock(), threading.RLock()
    >>> acquire_all([a, b]); a.release(); b.release()
    """
    taken = 0
    try:
        for lk in locks:
            # a table's call holds interrupts here (a section): one held meanwhile is raised between tries,
            # where no lock is half taken (raised as the acquire returned, it left that lock held for good)
            while not lk.acquire(timeout=HELD_TURN_S):
                deliver_held()
            taken += 1
    except BaseException:
        for lk in reversed(locks[:taken]):
            lk.release()
        raise


@contextlib.contextmanager
def through_interrupts(lock: threading.Lock | threading.RLock | threading.Condition) -> Iterator[None]:
    """Hold ``lock`` for a call's bookkeeping after its effect, even when interrupted while waiting for it.

    A call that has written or taken items must count them: an interrupt (a ``KeyboardInterrupt``) raised
    while it waited for the table's condition, held by a sample waiting for a long insert's shards, left
    an insert forever in flight, or a sample's given-back count uncounted.  The interrupt is raised once
    the block is done.

    Parameters
    ----------
    lock : lock or threading.Condition
        What the bookkeeping holds.

    Examples
    --------
    >>> lk = threading.Lock()
    >>> with through_interrupts(lk):
    ...     lk.locked()
    True
    """
    deferred = None
    while True:
        try:
            lock.acquire()
            break
        except BaseException as e:  # (while it waited: the lock is not held)
            deferred = e
    try:
        yield
    finally:
        lock.release()
    if deferred is not None:
        raise deferred
