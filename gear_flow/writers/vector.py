"""Writing from a vectorised environment: one step of N environments per ``append``.

Gymnasium's ``VectorEnv`` (and TorchRL's batched envs) step N environments at
once and end their episodes independently.  :class:`VectorWriter` keeps the
episodes in progress in one ``[N, T, *shape]`` array per column (row ``i``:
environment ``i``'s episode so far); ``append(steps, done)`` writes row ``i``
of every column to environment ``i``'s next step, one assignment per column
for all N environments, then inserts the episodes of the environments whose
``done[i]`` is set in **one** insert (one transaction: all of them or none),
or two when some were given priorities and others none (those take the table's
default, as an ``insert`` without priorities gives it).  An environment's next
step then starts its next episode.

Memory: N rows of the longest episode in progress (``T`` doubles when an
episode outgrows it); ``max_episode_length`` bounds it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from ..errors import (
    CapacityError,
    InvalidDataError,
    InvalidPriorityError,
    SpecError,
    TableClosedError,
)
from ..interrupts import holds_interrupts
from ..table.results import InsertResult
from ..table.validate import real_numbers
from .buffer import BufferedWriter, check_step

if TYPE_CHECKING:
    from ..distributed.api import DistributedTable
    from ..table.local import LocalTable

logger = logging.getLogger(__name__)


class VectorWriter(BufferedWriter):
    """One episode buffer per environment of a vectorised env; see the module docstring.

    Parameters
    ----------
    table : LocalTable or DistributedTable
        A table of the same columns (its spec checks every step).
    num_envs : int
        ``N``, the environments stepped together.
    max_episode_length : int, optional
        End an environment's episode at this many steps (``truncated``).
    shard : int, optional
        Insert into this shard.
    timeout : float, optional
        Rate-limiter wait of each insert.

    Examples
    --------
    >>> import numpy as np
    >>> import gear_flow as gf
    >>> table = gf.LocalTable(gf.TableSpec((gf.ColumnSpec("obs", (2,)),), capacity=100))
    >>> w = VectorWriter(table, num_envs=3)
    >>> _ = w.append({"obs": np.zeros((3, 2))}, done=[False, True, False])  # env 1 ends its episode
    >>> _ = w.append({"obs": np.ones((3, 2))}, done=[True, False, True])  # envs 0 and 2 end theirs
    >>> table.size, w.pending.tolist()
    (5, [0, 1, 0])
    """

    def __init__(
        self,
        table: LocalTable | DistributedTable,
        num_envs: int,
        *,
        max_episode_length: int | None = None,
        shard: int | None = None,
        timeout: float | None = None,
    ):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise SpecError(f"num_envs ({num_envs!r}) must be a positive integer")
        m = max_episode_length
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise SpecError(f"max_episode_length ({m!r}) must be a positive integer or None")
        self._target(table, shard, timeout)
        self.num_envs = num_envs
        self.max_episode_length = m
        self._env = np.arange(num_envs)
        self._n = np.zeros(num_envs, dtype=np.int64)  # steps of each environment's episode in progress
        self._steps = {c.name: np.empty((num_envs, 16, *c.shape), dtype=c.dtype) for c in self.spec.columns}
        self._prio = np.full((num_envs, 16), np.nan)  # NaN: the step was appended without a priority
        self._ending: list[tuple[int, bool]] = []  # (env, truncated): complete, insert failed, retried first
        self._closed = False
        #: (env, episode id in the table, length, truncated) of every episode inserted
        self.ended: list[tuple[int, int, int, bool]] = []

    @property
    def pending(self) -> np.ndarray:
        """Steps buffered per environment (int64 ``[N]``)."""
        return self._n.copy()

    def append(
        self, steps: Mapping, done: Sequence[bool] | None = None, priorities: ArrayLike | None = None
    ) -> InsertResult | None:
        """Add one step of every environment; insert the episodes that ``done`` ends.

        Parameters
        ----------
        steps : mapping of str to array-like
            Every column, shape ``[N, *column.shape]``: row ``i`` is environment ``i``'s step.
        done : sequence of bool, optional
            ``[N]``: the environments whose episode ends with this step
            (terminated or truncated).
        priorities : array-like of float, optional
            ``[N]``: this step's item priority per environment.

        Returns
        -------
        InsertResult or None
            The insert of the episodes ended by this step (one per ended
            environment, in environment order), or None when none ended.
            If it fails (e.g. :class:`~gear_flow.RateLimitTimeout`, or an
            interrupt) the step is appended and the ended episodes stay
            buffered; the next ``append`` or :meth:`flush` inserts them first.
            That insert failing again, or interrupted before it stored, the
            ``append`` raises with nothing appended; interrupted once it stored
            (:class:`~gear_flow.errors.HeldInterrupt`), the step is appended.
            :attr:`pending` tells which.
        """
        self._settle()
        if self._closed:
            raise TableClosedError("the writer is closed")
        N = self.num_envs
        vals = check_step(self.spec, steps, lead=(N,))
        d = np.zeros(N, dtype=bool) if done is None else np.asarray(done)
        if d.shape != (N,) or d.dtype.kind not in "biu":
            raise InvalidDataError(f"done must be {N} booleans, got {d.dtype} of shape {d.shape}; nothing was appended")
        p = None
        if priorities is not None:
            p = real_numbers(priorities, "priorities")
            if p.shape != (N,):
                raise InvalidDataError(f"priorities must have shape ({N},), got {p.shape}; nothing was appended")
            bad = np.flatnonzero(~np.isfinite(p) | (p < 0))
            if len(bad):
                raise InvalidPriorityError(int(bad[0]), float(p[bad[0]]))
        self._buffered_after(self.flush if self._ending else None, self._record, vals, d, p)  # (ended earlier first)
        return self.flush() if self._ending else None

    @holds_interrupts
    def _record(self, vals: dict, d: np.ndarray, p: np.ndarray | None) -> None:
        """Every environment's step buffered, and the episodes it ends marked, as one section: cut between the
        two, a step was buffered with its episode's end forgotten (a hunt: a VectorWriter's episode never
        inserted)."""
        if self._n.max() == self._prio.shape[1]:
            self._grow()
        at = self._n
        for k, v in vals.items():  # every environment's step at once (cast to the column's dtype here)
            self._steps[k][self._env, at] = v
        self._prio[self._env, at] = np.nan if p is None else p
        self._n += 1
        ends = d != 0
        if self.max_episode_length is not None:
            ends |= self._n >= self.max_episode_length
        self._ending.extend((int(i), not d[i]) for i in np.flatnonzero(ends))

    def _grow(self) -> None:
        """Twice the steps per environment, keeping those buffered."""
        T = self._prio.shape[1]
        for k, a in self._steps.items():
            b = np.empty((a.shape[0], 2 * T, *a.shape[2:]), dtype=a.dtype)
            b[:, :T] = a
            self._steps[k] = b
        prio = np.full((self.num_envs, 2 * T), np.nan)
        prio[:, :T] = self._prio
        self._prio = prio

    def end_episodes(self, envs: Sequence[int] | None = None, truncated: bool = True) -> InsertResult | None:
        """End the episodes of ``envs`` (default: every environment with buffered steps) now.

        Parameters
        ----------
        envs : sequence of int, optional
        truncated : bool
            Recorded in :attr:`ended`.

        Returns
        -------
        InsertResult or None
        """
        self._settle()
        for i in self._envs(envs):
            if self._n[i] and all(e != i for e, _ in self._ending):
                self._ending.append((i, truncated))
        return self.flush() if self._ending else None

    def flush(self) -> InsertResult | None:
        """Insert the episodes that ended and are not inserted yet: one insert for those given priorities and
        one for those given none (which take the table's default, as an ``insert`` without priorities does);
        one each where a group could never go in together (a Queue smaller than its items, a shard's ring
        shorter than their steps).

        Returns
        -------
        InsertResult or None
            Every episode inserted.
        """
        self._settle()
        if not self._ending:
            return None
        envs = [e for e, _ in self._ending]
        some = [e for e in envs if not np.isnan(self._prio[e, : self._n[e]]).all()]
        groups = [g for g in (some, [e for e in envs if e not in some]) if g]
        return _joined([self._insert_group(g) for g in groups], [e for g in groups for e in g], envs)

    def _insert_group(self, envs: list[int]) -> InsertResult:
        """The ended episodes of ``envs`` as one insert, or one each when they could never go in together (the
        limiter or a shard's ring refuses their sum; each kept once it went in)."""
        prio = self._priorities(envs)
        try:
            return self._stored(self._insert, envs, prio)
        except (SpecError, CapacityError):  # (the episodes, shard and timeout are checked: only their sum is
            if len(envs) == 1:  # left, too many for the limiter or for a shard's ring, each of them not)
                raise
        return _joined(
            [  # (the priorities as the joint insert gives them)
                self._stored(
                    self._insert,
                    [e],
                    None if prio is None else prio[i : i + 1] if isinstance(prio, np.ndarray) else [prio[i]],
                )
                for i, e in enumerate(envs)
            ]
        )

    def _insert(self, envs: list[int], priorities) -> InsertResult:
        """Insert the ended episodes of ``envs`` as one call; they leave :attr:`_ending` once it went in."""
        episodes = [{k: a[e, : self._n[e]] for k, a in self._steps.items()} for e in envs]  # views: insert copies
        res = self._table_insert(episodes, priorities, timeout=self.timeout, shard=self.shard)
        truncated = dict(self._ending)
        for e, eid in zip(envs, res.episode_ids):
            self.ended.append((e, int(eid), int(self._n[e]), truncated[e]))
        self._n[envs] = 0
        went = set(envs)
        self._ending = [(e, t) for e, t in self._ending if e not in went]
        return res

    def _priorities(self, envs: list[int]):
        """The insert's priorities: None when no step of these episodes had one (the table's default); else a
        step without one gets the largest of its episode, and an episode item the largest of its steps
        (:meth:`flush` groups the episodes so that each given any has one)."""
        prio = [self._prio[e, : self._n[e]] for e in envs]
        given = [p[~np.isnan(p)] for p in prio]
        if not any(len(g) for g in given):
            return None
        default = [float(g.max()) for g in given]
        if self.spec.item_unit == "episode":
            return np.array(default)
        return [np.where(np.isnan(p), m, p) for p, m in zip(prio, default)]

    def discard(self, envs: Sequence[int] | None = None) -> int:
        """Drop the buffered steps of ``envs`` (default: all).

        Parameters
        ----------
        envs : sequence of int, optional
            Environment indices, ``0 <= e < num_envs`` (default: every one).

        Returns
        -------
        int
            Steps dropped.
        """
        self._settle()
        envs = sorted(set(self._envs(envs)))
        n = int(self._n[envs].sum())
        self._n[envs] = 0
        gone = set(envs)
        self._ending = [(e, t) for e, t in self._ending if e not in gone]
        return n

    def _envs(self, envs: Sequence[int] | None) -> list[int]:
        """``envs`` as ints (default: every environment), each checked to be one."""
        envs = range(self.num_envs) if envs is None else [int(e) for e in envs]
        for e in envs:
            if not 0 <= e < self.num_envs:
                raise SpecError(f"environment {e!r} is not in [0, {self.num_envs})")
        return list(envs)

    def _flush(self) -> None:
        self.end_episodes()


def _joined(results: list[InsertResult], went: list[int] | None = None, order: list[int] | None = None) -> InsertResult:
    """Several inserts' results as one: their episodes in the order of the inserts, or, given the environment
    of each (``went``, in that order), in environment order ``order``."""
    if len(results) == 1:
        return results[0]
    parts = [np.concatenate([getattr(r, f) for r in results]) for f in ("episode_ids", "first_keys", "shards")]
    if went is not None:
        at = {e: i for i, e in enumerate(went)}
        pick = np.array([at[e] for e in order], dtype=np.int64)
        parts = [a[pick] for a in parts]
    return InsertResult(*parts, sum(r.num_items for r in results))
