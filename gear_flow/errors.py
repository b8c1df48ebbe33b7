"""Exception hierarchy.

Every error raised on purpose by gear_flow derives from :class:`GearFlowError`.
Subclasses also derive from the closest builtin (``ValueError``, ``KeyError``,
``TimeoutError``) so that generic handlers keep working.  Messages name the bad
value and what is allowed.  Two interrupts are here too, not errors:
:class:`HeldInterrupt`, a ``KeyboardInterrupt`` raised once the call it found
changing a table was done, and :class:`InterruptedInFlight`, one raised at
once while a distributed table's call goes on to its end.
"""

from __future__ import annotations

import concurrent.futures
import os


class GearFlowError(Exception):
    """Root of all gear_flow errors."""


class SpecError(GearFlowError, ValueError):
    """A specification (column, table, selector, limiter) is invalid."""


class InvalidDataError(GearFlowError, ValueError):
    """Inserted data does not match the table's spec (shape, dtype, columns)."""


class ProtocolError(SpecError):
    """A message to a worker or the coordinator is malformed, out of range or of another protocol version.

    Raised where the message enters, before anything changes; it names the
    operation, the field and what is allowed.
    """


class DatasetError(InvalidDataError):
    """An offline dataset file is malformed (raised by :mod:`gear_flow.ingest`).

    Parameters
    ----------
    path : str or os.PathLike
        The file (or dataset directory) at fault; kept as ``str`` in ``.path``.
    episode : int, str or None
        The episode at fault (its index or id in the file), None when the
        problem is with the whole file.
    problem : str
        What is wrong and what is allowed.

    Each parameter is kept as the attribute of the same name.
    """

    def __init__(self, path: str | os.PathLike[str], episode: int | str | None, problem: str):
        self.path = str(path)
        self.episode = episode
        self.problem = problem
        where = self.path if episode is None else f"{self.path}, episode {episode}"
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):  # errors travel between Dask processes
        return (type(self), (self.path, self.episode, self.problem))


class CapacityError(GearFlowError, ValueError):
    """An insert does not fit the storage: larger than a shard can ever hold, or (queues and
    stacks) it would overwrite items still waiting to be sampled."""


class InvalidPriorityError(GearFlowError, ValueError):
    """A priority is NaN, infinite or negative, or its weight ``priority ** alpha`` is too large.

    Parameters
    ----------
    index : int
        Position of the first bad priority in the call's input; kept as ``.index``.
    value : float
        The bad value; kept as ``.value``.
    message : str, optional
        The whole message, when the default one ("must be finite and >= 0")
        does not say what is wrong (a weight that overflows, say).
    """

    def __init__(self, index: int, value: float, message: str | None = None):
        self.index = int(index)
        self.value = float(value)
        super().__init__(
            message
            or f"priority[{self.index}] = {self.value!r} is invalid: priorities must be "
            "finite and >= 0; nothing from this call was applied"
        )
        self._message = message

    def __reduce__(self):  # errors travel between Dask processes
        return (type(self), (self.index, self.value, self._message))


class UnknownKeyError(GearFlowError, KeyError):
    """A key was never issued by this table (wrong table, wrong shard, or made up).

    Keys of items that existed but were evicted are *stale*, not unknown: they are
    ignored and counted instead.

    Parameters
    ----------
    key : int
        The 64-bit key; kept as ``.key``.
    reason : str
        Why it is unknown (which check failed); kept as ``.reason``.
    """

    def __init__(self, key: int, reason: str):
        self.key = int(key)
        self.reason = reason
        super().__init__(f"key {self.key:#x} is unknown to this table: {reason}")

    def __reduce__(self):
        return (type(self), (self.key, self.reason))

    def __str__(self) -> str:  # KeyError quotes its argument otherwise
        return str(self.args[0])


class EmptyTableError(GearFlowError, ValueError):
    """Nothing can be sampled (no items, or none with a valid window / nonzero mass)."""


class WindowTooLongError(EmptyTableError):
    """The requested window length fits in no stored episode (strict mode).

    Parameters
    ----------
    length : int
        The requested window length, in steps; kept as ``.length``.
    longest : int
        The longest stored episode, in steps; kept as ``.longest``.
    """

    def __init__(self, length: int, longest: int):
        self.length = int(length)
        self.longest = int(longest)
        super().__init__(
            f"window length {self.length} is longer than every stored episode "
            f"(longest: {self.longest} steps); use a length <= {self.longest} or "
            "boundary='pad_tail'/'pad_head'"
        )

    def __reduce__(self):
        return (type(self), (self.length, self.longest))


def nothing_to_sample(who: str, size: int, longest: int, length: int, boundary: str) -> EmptyTableError:
    """The error for a sample that finds nothing: empty, window too long, or no weight left.

    Parameters
    ----------
    who : str
        Names the table or shard in the message ("the table", "table 'replay'", "shard 3").
    size : int
        Items stored.
    longest : int
        The longest stored episode, in steps.
    length : int
        The requested window length, in steps.
    boundary : str
        The sample's boundary mode (``"strict"``, ``"pad_tail"``, ``"pad_head"``).

    Returns
    -------
    EmptyTableError
        The error to raise: :class:`WindowTooLongError` when ``boundary`` is
        ``"strict"`` and no episode is ``length`` steps long, a plain
        :class:`EmptyTableError` otherwise.
    """
    if size == 0:
        return EmptyTableError(f"{who} holds no items")
    if boundary == "strict" and longest < length:
        return WindowTooLongError(length, longest)
    return EmptyTableError(
        f"{who}: no item with a nonzero sampling weight has a window of length {length} ({boundary})"
    )


class RateLimitTimeout(GearFlowError, TimeoutError):
    """A blocking insert or sample was not allowed by the rate limiter in time."""


class HeldInterrupt(KeyboardInterrupt):
    """A ``KeyboardInterrupt`` (Ctrl-C, a notebook's stop) that found a table's call changing the table, held
    until the change was whole: the call is done (an insert stored, a sample's items taken), and ``result`` is
    what it returned, for a caller that wants it (a Queue's batch, the keys of an insert).

    A plain ``KeyboardInterrupt`` from a table's call means the call left nothing: it was interrupted before
    it changed anything, or while it waited.

    Parameters
    ----------
    result : object
        The call's answer.

    Attributes
    ----------
    result : object
        The call's answer.
    """

    def __init__(self, result: object = None) -> None:
        super().__init__(
            "interrupted while the call changed the table: raised once that was done (its answer: .result)"
        )
        self.result = result


class InterruptedInFlight(KeyboardInterrupt):
    """A ``KeyboardInterrupt`` (Ctrl-C, a notebook's stop) that found a distributed table's blocking insert where
    it could no longer be taken back (its workers may hold its items): the caller gets it at once, and the
    insert goes on to its end in the background, so that the workers and the coordinator agree.  ``outcome``
    says how it ended.

    Raised too when the event loop carries an insert or a sample (no lane; a Queue's sample): the interrupt
    cancels it there, and it ends as its steps allow, cancelled before it changed anything or gone on to its
    end (a Queue's batch, whose items left the queue).

    Parameters
    ----------
    outcome : concurrent.futures.Future
        The call's end.

    Attributes
    ----------
    outcome : concurrent.futures.Future
        Its result is the call's answer (an insert's :class:`~gear_flow.table.results.InsertResult`: stored;
        a sample's batch); it raises ``CancelledError`` for a call stopped before it changed anything, or the
        call's error.
    """

    def __init__(self, outcome: concurrent.futures.Future) -> None:
        super().__init__(
            "interrupted while the call went on on the table's workers: it ends in the background (.outcome)"
        )
        self.outcome = outcome


class TableClosedError(GearFlowError, RuntimeError):
    """The table (or the writer) was closed."""


class ShardLostError(GearFlowError, RuntimeError):
    """A shard's worker is gone; the operation needed it.

    Parameters
    ----------
    shard : int
        The lost shard's id; kept as ``.shard``.
    detail : str, default ""
        What was being done, appended to the message; kept as ``.detail``.
    stored : bool, optional
        Of an insert: False when nothing of it was stored (it may be sent
        again), True when some or all of it was (it must not be); None for
        other operations.  Kept as ``.stored``.
    """

    def __init__(self, shard: int, detail: str = "", stored: bool | None = None):
        self.shard = int(shard)
        self.detail = detail
        self.stored = stored
        super().__init__(f"shard {self.shard} is lost" + (f": {detail}" if detail else ""))

    def __reduce__(self):
        return (type(self), (self.shard, self.detail, self.stored))


class ShardMovedError(GearFlowError, RuntimeError):
    """A request reached a worker its shards have left (handed to another worker), or one that took shards
    at a newer placement than the request's; the handle looks the placement up and sends it again.

    Raised to a caller only when a request was redone too often while shards kept moving.

    Parameters
    ----------
    epoch : int
        The placement version the worker's shards are at; kept as ``.epoch``.
    detail : str, default ""
        Which table and worker; kept as ``.detail``.
    """

    def __init__(self, epoch: int, detail: str = ""):
        self.epoch = int(epoch)
        self.detail = detail
        super().__init__(f"shards moved (placement version {self.epoch})" + (f": {detail}" if detail else ""))

    def __reduce__(self):
        return (type(self), (self.epoch, self.detail))


class CoordinatorLostError(GearFlowError, ConnectionError):
    """The scheduler (which coordinates distributed tables) cannot be reached."""


class CheckpointError(GearFlowError, ValueError):
    """A checkpoint is corrupted, of another version, or does not match the table."""


class DeployError(GearFlowError, RuntimeError):
    """A cluster cannot be started on this machine: what was asked for and what is missing.

    Parameters
    ----------
    what : str
        What was asked for (``"a LocalCUDACluster"``); kept as ``.what``.
    missing : str
        What this machine lacks, and what to do about it (one line); kept as ``.missing``.
    """

    def __init__(self, what: str, missing: str):
        self.what = what
        self.missing = missing
        super().__init__(f"cannot start {what} here: {missing}")

    def __reduce__(self):
        return (type(self), (self.what, self.missing))
