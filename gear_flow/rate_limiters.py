"""Rate limiters with Reverb's semantics.

A limiter tracks ``diff = inserts * samples_per_insert - samples`` over the
whole table (all shards) and decides whether an insert of ``k`` items or a
sample of ``n`` items may go ahead now:

* sampling needs ``size >= min_size_to_sample`` and ``diff - n >= min_diff``;
* inserting is always allowed while the table is below ``min_size_to_sample``
  (counting the new items), otherwise it needs ``(inserts + k) * spi - samples
  <= max_diff``: ``diff`` after the insert, computed in Reverb's order (the
  same sum in another order rounds differently, and a boundary insert went
  the other way for a ``samples_per_insert`` such as 0.1).

Calls are atomic: a batch is admitted whole or waits.  A call that could never
be admitted (``n > max_diff - min_diff``) is rejected at once rather than left
to block forever, and configurations that deadlock are rejected at
construction.  The limiter is pure state; the table does the waiting (with a
timeout) under its own condition variable.
"""

from __future__ import annotations

import math
import numbers
import sys
from abc import ABC
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import SpecError

_INF = sys.float_info.max


@dataclass
class LimiterState:
    """Counters of a limiter (checkpointed with the table).

    Attributes
    ----------
    inserts : int
        Items admitted by inserts since the table was created.
    samples : int
        Items handed out by samples.
    deletes : int
        Items removed (evicted, deleted, expired).
    """

    inserts: int = 0
    samples: int = 0
    deletes: int = 0


def _check_rate(samples_per_insert, min_size_to_sample) -> None:
    if not (isinstance(min_size_to_sample, int) and not isinstance(min_size_to_sample, bool)) or min_size_to_sample < 1:
        raise SpecError(f"min_size_to_sample ({min_size_to_sample!r}) must be a positive integer")
    if (
        isinstance(samples_per_insert, bool)
        or not (isinstance(samples_per_insert, (int, float)) and math.isfinite(samples_per_insert))
        or samples_per_insert <= 0
    ):
        raise SpecError(f"samples_per_insert ({samples_per_insert!r}) must be a positive finite number")


class RateLimiter(ABC):  # noqa: B024  (abstract by intent: use a subclass)
    """Base of every limiter; see the module docstring.

    Subclass it for a custom limiter: call ``super().__init__`` with the four
    numbers below, implement :meth:`params`, and register the class
    (:func:`gear_flow.register_rate_limiter`) so that distributed tables and
    checkpoints can rebuild it.

    Parameters
    ----------
    samples_per_insert : float
        Weight of one inserted item in ``diff``; positive and finite.
    min_size_to_sample : int
        Items the table must hold before any sample is admitted; positive.
    min_diff : float
        A sample of ``n`` is admitted only if ``diff - n >= min_diff``
        (``-sys.float_info.max``: no lower bound).
    max_diff : float
        Past ``min_size_to_sample``, an insert of ``k`` is admitted only if
        ``(inserts + k) * samples_per_insert - samples <= max_diff``
        (``sys.float_info.max``: no upper bound).

    Raises
    ------
    SpecError
        ``samples_per_insert`` or ``min_size_to_sample`` out of range.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float, max_diff: float):
        _check_rate(samples_per_insert, min_size_to_sample)
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = int(min_size_to_sample)
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)
        self.state = LimiterState()

    # -- decisions -------------------------------------------------------------
    @property
    def diff(self) -> float:
        """``inserts * samples_per_insert - samples``: what admission compares with ``min_diff``/``max_diff``."""
        return self.state.inserts * self.samples_per_insert - self.state.samples

    def can_insert(self, k: int, size: int) -> bool:
        """May an insert of ``k`` items go ahead now?

        Parameters
        ----------
        k : int
            Items the insert adds (steps or episodes, the table's item unit).
        size : int
            Items the table holds now, counting inserts already admitted but
            not yet applied (Reverb's count).

        Returns
        -------
        bool
            True while the table is below ``min_size_to_sample`` counting the
            new items, else whether ``(inserts + k) * samples_per_insert - samples <= max_diff`` (Reverb's
            ``CanInsert``, in its order of operations: the same boundary decision).
        """
        if size + k <= self.min_size_to_sample:
            return True
        return (self.state.inserts + k) * self.samples_per_insert - self.state.samples <= self.max_diff

    def can_sample(self, n: int, size: int) -> bool:
        """May a sample of ``n`` items go ahead now?

        Parameters
        ----------
        n : int
            Items the sample hands out (its batch size).
        size : int
            Items the table holds now.

        Returns
        -------
        bool
            ``size >= min_size_to_sample`` and ``diff - n >= min_diff``.
        """
        if size < self.min_size_to_sample:
            return False
        return self.diff - n >= self.min_diff

    def check_insert_size(self, k: int) -> None:
        """Reject an insert of ``k`` items that this limiter could never admit from now on.

        Samples lower ``diff`` to ``min_diff`` at most, but before sampling starts
        ``diff`` may still be below ``min_diff`` (0 for a new table), where a
        larger insert is admissible; the bound uses the lower of the two.

        Parameters
        ----------
        k : int
            Items in the insert.

        Raises
        ------
        SpecError
            The insert can never be admitted (it would wait forever).
        """
        low = min(self.diff, self.min_diff)
        span = self.max_diff - low
        if k * self.samples_per_insert > span and k > self.min_size_to_sample:
            raise SpecError(
                f"an insert of {k} items can never be admitted by {self!r}: "
                f"{k} * samples_per_insert = {k * self.samples_per_insert:g} exceeds "
                f"max_diff - min(diff, min_diff) = {span:g}; insert fewer items per call or widen error_buffer"
            )

    def check_sample_size(self, n: int) -> None:
        """Reject a sample of ``n`` items that this limiter could never admit.

        Parameters
        ----------
        n : int
            Items in the sample.

        Raises
        ------
        SpecError
            ``n > max_diff - min_diff``: the sample would wait forever.
        """
        span = self.max_diff - self.min_diff
        if n > span:
            raise SpecError(
                f"a sample of {n} items can never be admitted by {self!r}: it exceeds the "
                f"limiter's range max_diff - min_diff = {span:g}; sample fewer or widen error_buffer"
            )

    def check_table(self, max_size: int) -> None:
        """Reject configurations that deadlock with a table of ``max_size`` items.

        Parameters
        ----------
        max_size : int
            Most items the table can hold (all shards).

        Raises
        ------
        SpecError
            ``min_size_to_sample > max_size``: sampling could never start.
        """
        if self.min_size_to_sample > max_size:
            raise SpecError(
                f"min_size_to_sample ({self.min_size_to_sample}) is larger than the table's "
                f"max_size ({max_size}): sampling could never start"
            )

    # -- bookkeeping -------------------------------------------------------------
    def on_insert(self, k: int) -> None:
        """Count an admitted insert.

        Parameters
        ----------
        k : int
            Items it added.
        """
        self.state.inserts += int(k)

    def on_sample(self, n: int) -> None:
        """Count an admitted sample.

        Parameters
        ----------
        n : int
            Items it handed out.
        """
        self.state.samples += int(n)

    def give_back_insert(self, k: int) -> None:
        """``k`` items of an admitted insert were not stored after all (aborted, or routed to a shard lost
        before its apply): their admission no longer counts.

        Parameters
        ----------
        k : int
            Items given back.
        """
        self.state.inserts -= int(k)

    def give_back_sample(self, n: int) -> None:
        """``n`` items of an admitted sample were not handed out after all (it failed, or its items left
        could not fill it): their admission no longer counts.

        Parameters
        ----------
        n : int
            Items given back.
        """
        self.state.samples -= int(n)

    def restore(self, state: Mapping[str, int]) -> None:
        """Set the counters from a checkpoint (:func:`to_config`'s ``state``).

        Parameters
        ----------
        state : mapping
            Some of ``inserts``, ``samples``, ``deletes``; the others keep
            their value.
        """
        for k, v in state.items():
            setattr(self.state, k, v)

    def on_delete(self, k: int) -> None:
        """Count removed items (evicted, deleted, expired); ``diff`` does not change.

        Parameters
        ----------
        k : int
            Items removed.
        """
        self.state.deletes += int(k)

    def settle(self, size: int) -> None:
        """A restored table holds ``size`` items: counts that say how many items wait are made to agree.

        A checkpoint takes the limiter's counts and the shards' snapshots at different moments, and calls
        under way between them made the two differ: a :class:`Queue` restored with 3 items counted 2 waiting,
        and one of them never went out.  Other limiters' counts are history, not the table's content: they
        are left as they are.

        Parameters
        ----------
        size : int
            Items the restored table holds.
        """
        del size

    def forget(self, k: int) -> None:
        """``k`` items left the table unsampled (deleted, evicted, lost): a :class:`Queue` no longer counts
        them as waiting; other limiters count them as deletes only (:meth:`on_delete`, Reverb's).

        Parameters
        ----------
        k : int
            Items; negative for items brought back (a lost shard restored).
        """
        del k  # counted by on_delete; nothing waits here

    def info(self) -> dict[str, object]:
        """The limiter's configuration and counters, for ``table.info()`` and the dashboard.

        Returns
        -------
        dict
            ``kind`` (class name), ``samples_per_insert``,
            ``min_size_to_sample``, ``min_diff`` and ``max_diff`` (None when
            unbounded), ``inserts``, ``samples``, ``deletes``.
        """
        return {
            "kind": type(self).__name__,
            "samples_per_insert": self.samples_per_insert,
            "min_size_to_sample": self.min_size_to_sample,
            "min_diff": self.min_diff if self.min_diff > -_INF else None,
            "max_diff": self.max_diff if self.max_diff < _INF else None,
            "inserts": self.state.inserts,
            "samples": self.state.samples,
            "deletes": self.state.deletes,
        }

    def params(self) -> dict[str, object]:
        """The constructor's keyword arguments that rebuild this limiter (without its counters).

        Every subclass implements it; :func:`to_config` stores it and
        :func:`from_config` calls ``cls(**params)``.

        Returns
        -------
        dict
            Keyword argument name to value, JSON-able but for tuples.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.params().items())})"


class MinSize(RateLimiter):
    """Block sampling until the table holds ``min_size_to_sample`` items.

    Parameters
    ----------
    min_size_to_sample : int, default 1
        Items the table must hold before sampling starts; inserts never block.

    Examples
    --------
    >>> MinSize(1000)
    MinSize(min_size_to_sample=1000)
    """

    def __init__(self, min_size_to_sample: int = 1):
        super().__init__(1.0, min_size_to_sample, -_INF, _INF)

    def params(self) -> dict:
        return {"min_size_to_sample": self.min_size_to_sample}


class SampleToInsertRatio(RateLimiter):
    """Keep ``samples / inserts`` near ``samples_per_insert`` once the table is warm.

    Parameters
    ----------
    samples_per_insert : float
        Average number of times each item is sampled over its lifetime.
    min_size_to_sample : int
        Below this size sampling blocks and inserting never does.
    error_buffer : float or (float, float)
        Allowed deviation of ``(inserts - min_size_to_sample) * spi - samples``
        around 0 before calls block; a pair gives ``(min_diff, max_diff)``
        without the offset.  Must span at least ``2 * max(1, spi)``.

    Examples
    --------
    >>> SampleToInsertRatio(samples_per_insert=4, min_size_to_sample=100, error_buffer=50)
    SampleToInsertRatio(samples_per_insert=4.0, min_size_to_sample=100, error_buffer=(350.0, 450.0))
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float | tuple[float, float]):
        # validated before the offset below is computed from them (a str would raise TypeError)
        _check_rate(samples_per_insert, min_size_to_sample)
        if isinstance(error_buffer, (int, float)) and not isinstance(error_buffer, bool):
            if not math.isfinite(error_buffer) or error_buffer <= 0:
                raise SpecError(f"error_buffer ({error_buffer!r}) must be a positive finite number")
            offset = samples_per_insert * min_size_to_sample
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        else:
            try:
                pair = tuple(error_buffer)
            except TypeError:
                pair = ()
            if len(pair) != 2 or any(isinstance(x, bool) or not isinstance(x, numbers.Real) for x in pair):
                raise SpecError(
                    f"error_buffer ({error_buffer!r}) must be a number or a (min_diff, max_diff) pair of numbers"
                )
            min_diff, max_diff = (float(x) for x in pair)
        if not (math.isfinite(min_diff) and math.isfinite(max_diff)):  # (NaN compares false: never admitted)
            raise SpecError(
                f"error_buffer {error_buffer!r} gives min_diff {min_diff:g} and max_diff {max_diff:g}; both must be "
                "finite numbers"
            )
        super().__init__(samples_per_insert, min_size_to_sample, min_diff, max_diff)
        spi = self.samples_per_insert
        if max_diff - min_diff < 2 * max(1.0, spi):
            raise SpecError(
                f"error_buffer {error_buffer!r} spans {max_diff - min_diff:g}, which must be >= "
                f"2 * max(1, samples_per_insert) = {2 * max(1.0, spi):g}; smaller values can block "
                "samples and inserts forever"
            )
        if min_diff > spi * self.min_size_to_sample:
            raise SpecError(
                f"min_diff ({min_diff:g}) is above samples_per_insert * min_size_to_sample "
                f"({spi * self.min_size_to_sample:g}): the table would deadlock once it reaches min size"
            )
        # max_diff below spi * min_size_to_sample is allowed, as in Reverb: the inserts up to
        # min_size_to_sample are free, then inserts wait for samples, which can start (the
        # span above keeps min_diff at least 2 * max(1, spi) below max_diff): nothing deadlocks.

    def params(self) -> dict:
        return {
            "samples_per_insert": self.samples_per_insert,
            "min_size_to_sample": self.min_size_to_sample,
            "error_buffer": (self.min_diff, self.max_diff),
        }


class Queue(RateLimiter):
    """A bounded queue: every item sampled once, in order; inserts block when full.

    Use with ``sampler=Fifo()``, ``remover=Fifo()``, ``max_times_sampled=1`` and
    ``max_size=size`` (``LocalTable.queue`` builds exactly that).

    Inserts are admitted against the items stored plus those of inserts
    already admitted (Reverb's count), and blocked calls are served first
    come, first served per kind, so several producers never overfill it and
    no item is dropped.  Where we differ from Reverb on purpose: a batch is
    admitted whole or waits (atomic), and an insert that would make a shard's
    ring overwrite an item still waiting raises
    :class:`~gear_flow.errors.CapacityError` instead of dropping it (a Queue
    consumed in order needs a capacity of ``size`` plus the longest episode;
    an item left waiting while the ring goes round, a Stack's bottom one,
    blocks inserts when the ring comes back to it, whatever the capacity).

    Parameters
    ----------
    size : int
        Most items waiting to be sampled; positive.

    Examples
    --------
    >>> Queue(100)
    Queue(size=100)
    """

    def __init__(self, size: int):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise SpecError(f"queue size ({size!r}) must be a positive integer")
        self.size = size
        super().__init__(1.0, 1, 0.0, float(size))

    def params(self) -> dict:
        return {"size": self.size}

    def forget(self, k: int) -> None:
        """Every item of a queue is sampled once, so ``inserts - samples`` counts the items waiting:
        ``k`` that left unsampled (deleted, evicted, lost) wait no more.  Left counted, they would let a
        batch through that finds too few items, and keep their room from later inserts for good.

        Parameters
        ----------
        k : int
            Items; negative for items brought back (a lost shard restored).
        """
        self.state.inserts -= int(k)

    def settle(self, size: int) -> None:
        """Every item of a queue waits (each goes once, and leaves when it goes): ``inserts - samples`` is
        made ``size``, the items of the restored table (see :meth:`RateLimiter.settle`).

        Parameters
        ----------
        size : int
            Items the restored table holds.
        """
        self.state.inserts = self.state.samples + int(size)


class Stack(Queue):
    """A bounded stack: like :class:`Queue` with Lifo sampler and remover.

    Examples
    --------
    >>> Stack(100)
    Stack(size=100)
    """


#: name -> class, for configuration and checkpoints
REGISTRY: dict[str, type[RateLimiter]] = {
    "min_size": MinSize,
    "sample_to_insert_ratio": SampleToInsertRatio,
    "queue": Queue,
    "stack": Stack,
}


def to_config(limiter: RateLimiter) -> dict[str, object]:
    """A JSON-able description of a limiter, counters included.

    Parameters
    ----------
    limiter : RateLimiter
        An instance of a registered class (its own class: a subclass of a
        registered class must be registered itself).

    Returns
    -------
    dict
        ``{"kind": registered name, "params": params(), "state": counters}``.

    Raises
    ------
    TypeError
        The limiter's class is not registered.
    """
    for kind, cls in REGISTRY.items():
        if type(limiter) is cls:
            params = limiter.params()
            if "error_buffer" in params:
                params["error_buffer"] = list(params["error_buffer"])
            return {"kind": kind, "params": params, "state": dict(limiter.state.__dict__)}
    raise TypeError(f"{limiter!r} is not a registered rate limiter; registered: {sorted(REGISTRY)}")


def from_config(cfg: Mapping[str, Any]) -> RateLimiter:
    """Inverse of :func:`to_config` (restores the counters too).

    Parameters
    ----------
    cfg : mapping
        As :func:`to_config` made it (``params`` and ``state`` optional).

    Returns
    -------
    RateLimiter
        A new limiter of the registered class, with those counters.

    Raises
    ------
    SpecError
        ``kind`` is not registered, or the parameters are invalid.
    """
    try:
        cls = REGISTRY[cfg["kind"]]
    except KeyError:
        raise SpecError(f"unknown rate limiter kind {cfg.get('kind')!r}; known: {sorted(REGISTRY)}") from None
    from .selectors import construct

    params = cfg.get("params", {})
    if isinstance(params, Mapping) and isinstance(params.get("error_buffer"), list):
        params = {**params, "error_buffer": tuple(params["error_buffer"])}
    lim = construct("rate limiter", cfg["kind"], cls, params)
    lim.restore(cfg.get("state", {}))
    return lim
