"""What a table handle knows of its placement: each shard's worker, the lost shards, the version.

The event loop changes it (a lookup at the coordinator, a loss this handle
found) while learners' and actors' threads read it to plan a sample or route
an insert.  So it is one object under one lock whose mappings are replaced
whole, never edited in place: a reader holds a consistent :class:`Placement`
(or the current ``placement`` / ``lost`` dict) however the loop changes the
view meanwhile.  What is kept per placement elsewhere (mapped rings, lanes,
masses, issued keys, stored priority updates) is dropped by the view's
subscribers, told of every change: the view does not know them.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from ..errors import ShardLostError


class Placement(NamedTuple):
    """One consistent reading of a :class:`TableView`.

    Attributes
    ----------
    shards : dict of int to str
        Worker address of each shard.
    lost : dict of int to dict
        Lost shards and the coordinator's record of each loss.
    version : int
        The coordinator's placement version this was learnt at.
    incarnation : dict of int to int
        Per shard, how often it was rebuilt (lost, or restored from a
        checkpoint).
    """

    shards: Mapping[int, str]
    lost: Mapping[int, dict]
    version: int
    incarnation: Mapping[int, int]


class TableView:
    """A handle's placement of its table's shards, under one lock; its changes told to subscribers.

    Parameters
    ----------
    name : str
        The table's name (for errors).
    state : dict
        The coordinator's ``lookup`` answer: ``placement``, and optionally
        ``lost``, ``version`` and ``incarnation``.
    degraded : bool
        Whether the table serves from the shards left after a loss.
    """

    def __init__(self, name: str, state: dict, degraded: bool) -> None:
        self.name = name
        self.degraded = degraded
        self._lock = threading.Lock()
        self._now = _placement(state)
        #: (placement, its live shards by worker) for :meth:`workers`
        self._by_worker: tuple[Placement, dict[str, list[int]]] | None = None
        self._subscribers: list[Callable[[Placement, Placement], None]] = []

    # -- reading -------------------------------------------------------------------------------------------------
    def now(self) -> Placement:
        """The placement as a whole, consistent however the event loop changes the view afterwards.

        Returns
        -------
        Placement
            Shards, lost shards, version and incarnations read together.
        """
        return self._now

    @property
    def placement(self) -> dict[int, str]:
        """Worker address of each shard (a dict never changed in place)."""
        return self._now.shards  # type: ignore[return-value]

    @property
    def lost(self) -> dict[int, dict]:
        """Lost shards with the coordinator's record of each loss (a dict never changed in place)."""
        return self._now.lost  # type: ignore[return-value]

    @property
    def version(self) -> int:
        """The placement version this view was learnt at."""
        return self._now.version

    def live_shards(self) -> list[int]:
        """Shards not lost, in order.

        Returns
        -------
        list of int
            Their ids.
        """
        now = self._now
        return sorted(s for s in now.shards if s not in now.lost)

    def workers(self, shards: Iterable[int] | None = None) -> dict[str, list[int]]:
        """The live shards (of ``shards``, default all) grouped by worker, each list in order.

        Parameters
        ----------
        shards : iterable of int, optional
            Only these shards.

        Returns
        -------
        dict of str to list of int
            ``{worker address: [shard, ...]}``.
        """
        now = self._now
        if shards is None:  # every batch asks this several times: once per placement, read-only from here
            cached = self._by_worker
            if cached is None or cached[0] is not now:
                cached = self._by_worker = (now, _by_worker(now, None))
            return dict(cached[1])
        return _by_worker(now, set(shards))

    def check_not_lost(self, stored: bool | None = None) -> None:
        """Refuse a call while a shard is lost and the table is not degraded.

        Parameters
        ----------
        stored : bool, optional
            The error's ``stored`` (an insert refused here stored nothing:
            False).

        Raises
        ------
        ShardLostError
            A shard is lost and the table is not ``degraded``.
        """
        lost = self._now.lost
        if lost and not self.degraded:
            raise ShardLostError(min(lost), f"table {self.name!r} lost shard(s) {sorted(lost)}", stored=stored)

    # -- changing (the event loop) -------------------------------------------------------------------------------
    def subscribe(self, fn: Callable[[Placement, Placement], None]) -> None:
        """Call ``fn(before, after)`` after every change of the view (in the changing thread).

        Parameters
        ----------
        fn : callable
            Drops what was kept for the placement ``before``.
        """
        self._subscribers.append(fn)

    def learn(self, state: dict) -> Placement:
        """Take the coordinator's ``lookup`` answer as the placement now; subscribers are told.

        Parameters
        ----------
        state : dict
            ``placement``, ``lost``, ``version`` and ``incarnation``.

        Returns
        -------
        Placement
            The placement before.
        """
        after = _placement(state)
        with self._lock:
            before, self._now = self._now, after
        for fn in self._subscribers:
            fn(before, after)
        return before

    def mark_lost(self, shard: int, record: dict) -> None:
        """Record ``shard`` as lost (the coordinator's ``record`` of the loss), keeping the rest.

        Parameters
        ----------
        shard : int
            The shard.
        record : dict
            The coordinator's record (``size_at_loss``, ``inserted_at_loss``,
            ``detail``).
        """
        with self._lock:
            now = self._now
            self._now = now._replace(lost={**now.lost, int(shard): record})


def _placement(state: dict) -> Placement:
    return Placement(
        {int(k): v for k, v in state["placement"].items()},
        {int(k): v for k, v in state.get("lost", {}).items()},
        int(state.get("version", 0)),
        {int(k): v for k, v in state.get("incarnation", {}).items()},
    )


def _by_worker(now: Placement, keep: set[int] | None) -> dict[str, list[int]]:
    by: dict[str, list[int]] = defaultdict(list)
    for s, a in sorted(now.shards.items()):
        if s not in now.lost and (keep is None or s in keep):
            by[a].append(s)
    return dict(by)
