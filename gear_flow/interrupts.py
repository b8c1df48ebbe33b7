"""Interrupts held off while a call's steps do their bookkeeping, let in while the call waits.

A call driven in its caller's thread (a distributed table's insert over its
workers' lanes, :mod:`gear_flow.distributed.thread_insert`) keeps what it has
done in the generator of its steps (:func:`gear_flow.table.planner.run`).  A
KeyboardInterrupt (Ctrl-C, a notebook's stop) lands between any two bytecodes
of the main thread: landing in that bookkeeping, between an admission and the
first request, or between the workers' apply and the commit, it left the
coordinator counting an insert in flight for good, or workers holding items
the coordinator never counted.  Python's own :class:`asyncio.Runner` meets
the same problem the same way: it replaces SIGINT's handler for the run, so
that the interrupt arrives where the program can act on it.

Here, while a plan's code runs (:meth:`HeldInterrupts.hold`), SIGINT's
handler only records the signal; while the call waits for an answer (a
worker's reply, an admission) the handler it replaced runs at once, as
without it: the call stays as quick to interrupt as before, and the waits it
cannot abandon hand the rest of the call to the event loop
(:meth:`~gear_flow.distributed.thread_insert.LaneTransaction.hand_over`).  A
signal held is delivered at the next wait (the plan's next request is then
interrupted before it is answered) or when the call ends.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any


class HeldInterrupts:
    """SIGINT's Python handler, held while a plan's code runs and let in while its requests are answered.

    A context manager around one call: in the main thread, with a Python
    handler for SIGINT (Python's own raises KeyboardInterrupt), it puts its
    own in for the call and the old one back after; anywhere else (a worker's
    task, another thread, SIGINT ignored) it changes nothing, and nothing can
    interrupt the call there.

    Examples
    --------
    >>> with HeldInterrupts() as interrupts:
    ...     live = interrupts.hold()
    ...     interrupts.restore(live)
    ...     interrupts.check()
    """

    def __init__(self) -> None:
        self._handler: Any = None  # the handler replaced, while this one is in
        self._live = True
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
        if self._live:
            self._handler(signum, frame)
        else:
            self._pending = (signum, frame)

    def hold(self) -> bool:
        """Hold interrupts from now (a plan's code is about to run).

        Returns
        -------
        bool
            Whether they were let in: what :meth:`restore` puts back.
        """
        live, self._live = self._live, False
        return live

    def restore(self, live: bool) -> None:
        """Put back what :meth:`hold` returned (a request is about to be answered: let in when it was).

        Parameters
        ----------
        live : bool
            :meth:`hold`'s answer.
        """
        self._live = live

    def check(self) -> None:
        """Deliver an interrupt held meanwhile, when interrupts are let in now: the handler replaced runs
        (Python's raises KeyboardInterrupt)."""
        if self._pending is not None and self._live:
            pending, self._pending = self._pending, None
            self._handler(*pending)
