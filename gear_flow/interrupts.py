"""Interrupts held off while a call's steps do their bookkeeping, let in while the call waits.

A call driven in its caller's thread (a distributed table's insert over its
workers' lanes, :mod:`gear_flow.distributed.thread_insert`) keeps what it has
done in the generator of its steps, driven by :func:`gear_flow.table.planner.run`.
A KeyboardInterrupt (Ctrl-C, a notebook's stop) lands between any two
bytecodes of the main thread: landing in that bookkeeping, between an
admission and the first request, or between the workers' apply and the
commit, it left the coordinator counting an insert in flight for good, or
workers holding items the coordinator never counted.  Python's own
:class:`asyncio.Runner` meets the same problem the same way: it replaces
SIGINT's handler for the run, so that the interrupt arrives where the program
can act on it.

Here SIGINT's handler looks at where the signal found the main thread: inside
a request being answered (:meth:`HeldInterrupts.let_in`, the innermost of the
two) the handler it replaced runs at once, as without it, so the call stays
as quick to interrupt while it waits for a worker's reply or an admission,
and the waits it cannot abandon hand the rest of the call to the event loop
(:meth:`~gear_flow.distributed.thread_insert.LaneTransaction.hand_over`);
inside :func:`~gear_flow.table.planner.run` itself, its plan's code or what
it calls on an answer's error, the signal is only recorded, and delivered at
the next request (:meth:`HeldInterrupts.check`) or when the call ends.  The
rule is read from the stack, not from a flag the driver sets and clears, so
no bytecode between the two leaves a gap.

A :class:`~gear_flow.table.LocalTable` call meets the same problem in its own
process: landing in its bookkeeping (a sum tree half repaired, a Queue's item
taken but still counted, an admission left heading its line), the interrupt
left the table broken for good.  Its mutating steps are sections
(:func:`holds_interrupts`), and a handler put in for the process
(:func:`guard_sigint`, by a section that finds Python's own in) holds a SIGINT
that finds the main thread in a section until the outermost section ends
(then a :class:`~gear_flow.errors.HeldInterrupt`: the call is done), or until a
wait inside takes it at one of its turns (:func:`deliver_held`: a plain
KeyboardInterrupt, the call leaving nothing).  Let in at once, it landed in
``threading.Condition.wait`` re-taking its lock and left the call believing it
held a lock another thread did.  Put in and out per call, a handler cost more
than a tiny sample itself.

A section may hold a distributed call: a writer's insert and its letting go
of the rows it stored are one (landing between the two, an interrupt left the
rows for a retry to store twice).  The call's waits (a request being answered,
a wait marked by :func:`lets_in`) still let interrupts in, as without the
section, and one the section held meanwhile comes at the call's next request
or wait, where the call acts on it; landing after the call returned, it comes
once the writer let go (a HeldInterrupt).
"""

from __future__ import annotations

import _signal
import concurrent.futures
import functools
import signal
import sys
import threading
from collections.abc import Callable, Collection
from types import CodeType, FrameType, TracebackType
from typing import Any, TypeVar

from .errors import HeldInterrupt
from .table import planner

T = TypeVar("T")

_NOTHING = object()  # (no answer yet: an interrupt held to the end of a call that raised comes as it is)


class HeldInterrupts:
    """SIGINT's Python handler for one call: held while a plan's steps run, let in while a request is answered.

    A context manager around the call: in the main thread, with a Python
    handler for SIGINT (Python's own raises KeyboardInterrupt), it puts its
    own in for the call and the old one back after; anywhere else (a worker's
    task, another thread, SIGINT ignored) it changes nothing, and nothing can
    interrupt the call there.

    Examples
    --------
    >>> with HeldInterrupts() as interrupts:
    ...     interrupts.let_in(abs, -2)
    2
    """

    def __init__(self) -> None:
        self._handler: Any = None  # the handler replaced, while this one is in
        self._pending: tuple[int, FrameType | None] | None = None
        self._result: Any = _NOTHING  # what the call returned (:meth:`returned`)

    def __enter__(self) -> HeldInterrupts:
        if threading.current_thread() is threading.main_thread():
            # (_signal's own functions: signal.signal and getsignal map handlers to enums, 13 us a call more)
            handler = _getsignal(_SIGINT)
            if callable(handler):
                self._handler = handler
                _signal.signal(_SIGINT, self._on_signal)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._handler is None:
            return
        _signal.signal(_SIGINT, self._handler)
        pending, self._pending = self._pending, None
        if pending is not None and kind is None:  # held to the call's end: delivered now (one leaving already
            if self._result is _NOTHING:  # with an error, an interrupt among them, reports that one)
                self._handler(*pending)
                return
            try:
                self._handler(*pending)
            except KeyboardInterrupt as e:  # the call is done: its answer goes with the interrupt
                raise HeldInterrupt(self._result) from e

    def returned(self, result: T) -> T:
        """``result``, the call's answer, kept for an interrupt held to the call's end: it comes as a
        :class:`~gear_flow.errors.HeldInterrupt` carrying it (a plain KeyboardInterrupt says the call left
        nothing, and an insert that stored its episode would be stored again by a writer's retry).

        Parameters
        ----------
        result : object
            The call's answer.

        Returns
        -------
        object
            ``result``.
        """
        self._result = result
        return result

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if _held_at(frame, _HELD, _LET_IN):  # the steps' own code: at the next request
            self._pending = (signum, frame)
            return
        self._handler(signum, frame)  # a request being answered, or no call of this one's: at once

    def let_in(self, answer: Callable[[Any], T], req: Any) -> T:
        """``answer(req)``, interrupts let in while it runs (:func:`~gear_flow.table.planner.run` answers each
        request through it).

        Parameters
        ----------
        answer : callable
            The executor.
        req : object
            The request.

        Returns
        -------
        object
            Its answer.
        """
        return answer(req)

    def check(self) -> None:
        """Deliver an interrupt held meanwhile (the handler replaced runs: Python's raises KeyboardInterrupt);
        an answer calls it before it sends its request, where the steps act on it.  One a section around the
        call holds (:func:`holds_interrupts`: a writer's insert and its letting go of the rows) comes here too:
        the call's steps act on it, where the section would hold it to the call's end."""
        deliver_held()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            if self._handler is _SECTIONS.on_signal:  # (raised here, not held again by that section)
                signal.default_int_handler(*pending)
            else:
                self._handler(*pending)


def _held_at(frame: FrameType | None, held: Collection[CodeType], let_in: Collection[CodeType]) -> bool:
    """Whether a signal that found the main thread at ``frame`` waits: the innermost frame running one of
    ``held`` or ``let_in`` decides (none: it does not)."""
    f = frame
    while f is not None:
        if f.f_code in let_in:
            return False
        if f.f_code in held:
            return True
        f = f.f_back
    return False


#: the frames that decide: a request being answered (or a wait marked by :func:`lets_in`) lets interrupts in, the
#: driver's own code holds them
_LET_IN: set[CodeType] = {HeldInterrupts.let_in.__code__}
_HELD = (planner.run.__code__,)


def lets_in(fn: Callable[..., T]) -> Callable[..., T]:
    """Mark ``fn`` as a wait that interrupts reach at once even inside a section (:func:`holds_interrupts`): a
    blocking distributed call's wait for its end (a writer's insert and its letting go of the rows are one
    section, and the insert must stay as quick to interrupt as without it).  ``fn`` should call
    :func:`deliver_held` before it waits (an interrupt the section held meanwhile).

    Parameters
    ----------
    fn : callable
        The wait.

    Returns
    -------
    callable
        ``fn`` itself.
    """
    _LET_IN.add(fn.__code__)
    return fn


class _Sections:
    """The process's SIGINT handler while a section may run (:func:`guard_sigint`): a signal that finds the
    main thread in a section is held until the outermost one ends (or a wait inside takes it:
    :func:`deliver_held`); anywhere else Python's own handler runs."""

    def __init__(self) -> None:
        self.held: set[CodeType] = set()  # the sections' code (one: the wrapper's)
        self.pending: tuple[int, FrameType | None] | None = None  # (a plain attribute: read at each section's end)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if _held_at(frame, self.held, _LET_IN):
            self.pending = (signum, frame)
            return
        signal.default_int_handler(signum, frame)

    def ended(self, frame: FrameType | None, result: object, done: bool) -> None:
        """A section ended with an interrupt held: raised (a :class:`~gear_flow.errors.HeldInterrupt` carrying
        ``result`` when it was ``done``, else a plain KeyboardInterrupt), unless inside an outer section (whose
        end raises it) or in another thread than the main one (whose section does)."""
        if threading.current_thread() is not threading.main_thread() or _held_at(frame, self.held, _LET_IN):
            return
        pending, self.pending = self.pending, None
        if pending is None:
            return
        if done:
            raise HeldInterrupt(result)
        signal.default_int_handler(*pending)


_SECTIONS = _Sections()


def guard_sigint() -> None:
    """Put the handler that holds interrupts in sections in, from the main thread, in place of Python's own
    (which it calls outside sections); a handler of the program's own is left alone.

    A section puts it in whenever it finds Python's own back: a notebook's kernel puts that in for each
    cell it runs and its own back after, so a handler put in once, at a table's construction, held nothing
    in the cells after.

    Examples
    --------
    >>> guard_sigint()
    """
    if _getsignal(_SIGINT) is signal.default_int_handler and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _SECTIONS.on_signal)


#: the current SIGINT handler, as is (``signal.getsignal`` maps it to an enum first: 2.6 us against 18 ns)
_getsignal = _signal.getsignal
_SIGINT = int(signal.SIGINT)


def holds_interrupts(fn: Callable[..., T]) -> Callable[..., T]:
    """Make ``fn`` a section: a SIGINT that finds the main thread inside it is held, and raised once the
    outermost section ends (a :class:`~gear_flow.errors.HeldInterrupt` carrying ``fn``'s answer: its work
    done), or at the next turn of a wait inside it (:func:`deliver_held`: a plain KeyboardInterrupt).

    Parameters
    ----------
    fn : callable
        A step that leaves its object broken when cut short between any two bytecodes.

    Returns
    -------
    callable
        ``fn`` as a section.
    """

    @functools.wraps(fn)
    def section(*args: Any, **kwargs: Any) -> T:
        if _getsignal(_SIGINT) is signal.default_int_handler:  # (Python's own back, or never replaced yet)
            guard_sigint()
        # no call between each test of `pending` below and the return or raise: a signal is handled at a call
        # (or a loop's jump), so one that comes later finds no section and is raised in the caller
        try:
            got = fn(*args, **kwargs)
        except BaseException:
            if _SECTIONS.pending is not None:
                _SECTIONS.ended(sys._getframe(1), None, False)
            raise
        if _SECTIONS.pending is not None:
            _SECTIONS.ended(sys._getframe(1), got, True)
        return got

    _SECTIONS.held.add(section.__code__)
    return section


@lets_in
def waited(end: concurrent.futures.Future[T]) -> T:
    """``end.result()``, a wait interrupts reach at once even inside a section (:func:`lets_in`), one the section
    held meanwhile first.

    Parameters
    ----------
    end : concurrent.futures.Future
        What is awaited.

    Returns
    -------
    object
        Its result.

    Examples
    --------
    >>> import concurrent.futures
    >>> end = concurrent.futures.Future()
    >>> end.set_result(2)
    >>> waited(end)
    2
    """
    deliver_held()
    return end.result()


def deliver_held() -> None:
    """Raise an interrupt held meanwhile (a plain KeyboardInterrupt), now: where a wait inside a section stops
    and its caller undoes what it began (an admission's wait leaving its line, between a lock's tries);
    nothing in another thread than the main one (whose section delivers it) or with none held.

    Examples
    --------
    >>> deliver_held()
    """
    if _SECTIONS.pending is not None and threading.current_thread() is threading.main_thread():
        pending, _SECTIONS.pending = _SECTIONS.pending, None
        signal.default_int_handler(*pending)
