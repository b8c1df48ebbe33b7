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
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, TypeVar

from .table import planner

T = TypeVar("T")


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

    def __enter__(self) -> HeldInterrupts:
        if threading.current_thread() is threading.main_thread():
            handler = signal.getsignal(signal.SIGINT)
            if callable(handler):
                self._handler = handler
                signal.signal(signal.SIGINT, self._on_signal)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._handler is None:
            return
        signal.signal(signal.SIGINT, self._handler)
        pending, self._pending = self._pending, None
        if pending is not None and kind is None:  # held to the call's end: delivered now (one leaving already
            self._handler(*pending)  # with an error, an interrupt among them, reports that one)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        f = frame
        while f is not None:
            if f.f_code is _LET_IN:  # a request being answered: at once
                break
            if f.f_code is _HELD:  # the steps' own code: at the next request
                self._pending = (signum, frame)
                return
            f = f.f_back
        self._handler(signum, frame)

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
        an answer calls it before it sends its request, where the steps act on it."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._handler(*pending)


#: the frames that decide: a request being answered lets interrupts in, the driver's own code holds them
_LET_IN = HeldInterrupts.let_in.__code__
_HELD = planner.run.__code__
