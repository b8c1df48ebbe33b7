"""A table's whole configuration, validated once: what every table (local or distributed) is built from.

:class:`TableConfig` is frozen and checked at construction, so the local table,
the distributed handle, the worker-side host and checkpoints all read the same
validated values; nobody builds a throw-away table to validate its arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from .. import config
from ..errors import SpecError
from ..rate_limiters import MinSize, Queue, RateLimiter, Stack
from ..rate_limiters import from_config as limiter_from_config
from ..rate_limiters import to_config as limiter_to_config
from ..selectors import REGISTRY, Fifo, Lifo, Selector, Uniform
from ..selectors import from_config as selector_from_config
from ..selectors import to_config as selector_to_config
from ..spec import BOUNDARIES, TableSpec
from .routing import ROUTINGS

if TYPE_CHECKING:
    import numpy as np

#: what a sample's selection needs from the shards (see :mod:`gear_flow.table.planner`)
SELECTION_KINDS = ("weighted", "epoch", "ordered")
TIERS = ("host", "shared", "pinned", "device", "disk")

#: the largest ``max_times_sampled``: each item's count of samples is an int32, and a draw never takes an item
#: more often than its count has left, so no count passes it
MAX_TIMES_SAMPLED = 2**31 - 1


#: the longest timeout in seconds (about 116 days), what ``inf`` stands for: a deadline further off overflowed
#: the platform's clock in a wait (OverflowError at 1e10 s), and the distributed protocol carries no more
MAX_TIMEOUT_S = 1e7


def check_timeout(t: object) -> float | None:
    """A timeout, the table's default or a call's: None (forever) or a number of seconds >= 0.

    ``inf`` stands for :data:`MAX_TIMEOUT_S`; a finite one beyond it is refused.

    Parameters
    ----------
    t : object
        The value given.

    Returns
    -------
    float or None
        ``t``; :data:`MAX_TIMEOUT_S` for ``inf``.

    Raises
    ------
    SpecError
        Anything else: a string, a bool, a negative number, NaN (which no deadline is ever past), or a
        finite number of seconds beyond :data:`MAX_TIMEOUT_S`.

    Examples
    --------
    >>> check_timeout(2.5), check_timeout(float("inf")), check_timeout(None)
    (2.5, 10000000.0, None)
    """
    import numbers

    if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or not t >= 0):
        raise SpecError(f"timeout ({t!r}) must be None or a number of seconds >= 0")
    if t is not None and t == float("inf"):
        return MAX_TIMEOUT_S
    if t is not None and t > MAX_TIMEOUT_S:
        raise SpecError(f"timeout ({t!r}) must be at most {MAX_TIMEOUT_S:g} s (inf means that long)")
    return t


@dataclass(frozen=True)
class TableConfig:
    """Spec, selectors, limiter and defaults of a table; validated, immutable.

    Parameters
    ----------
    spec : TableSpec
        Columns, capacity per shard, number of shards, item unit, max_size.
    sampler, remover : Selector
        Prototypes (each shard gets ``clone()`` of them).
    rate_limiter : RateLimiter
        Prototype of the table's global limiter.
    max_times_sampled : int
        Remove an item after this many samples (0: never; at most 2**31 - 1).
    boundary, routing, tier : str
        Defaults, after the ``dask.config`` fallbacks (``tier`` may also be a
        StorageTier instance).
    timeout : float or None
        Default seconds a blocking call waits.

    Raises
    ------
    SpecError
        Any invalid field, or a combination the storage cannot honour (a
        remover other than Fifo outside a queue/stack; a Queue/Stack limiter
        without matching selectors and ``max_times_sampled=1``); the message
        names the value and what is allowed.

    Examples
    --------
    >>> import numpy as np
    >>> from gear_flow import ColumnSpec, TableSpec, Prioritized
    >>> cfg = TableConfig.build(TableSpec((ColumnSpec("x", ()),), capacity=8), sampler=Prioritized())
    >>> cfg.selection
    'weighted'
    """

    spec: TableSpec
    sampler: Selector = field(default_factory=Uniform)
    remover: Selector = field(default_factory=Fifo)
    rate_limiter: RateLimiter = field(default_factory=lambda: MinSize(1))
    max_times_sampled: int = 0
    boundary: str = "strict"
    routing: str = "balanced"
    tier: object = "host"  # a tier name or a StorageTier instance
    timeout: float | None = None

    @classmethod
    def build(
        cls,
        spec: TableSpec,
        *,
        sampler: Selector | None = None,
        remover: Selector | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int = 0,
        boundary: str | None = None,
        routing: str | None = None,
        tier: str | None = None,
        timeout: float | None = None,
    ) -> TableConfig:
        """Apply defaults (``None`` → ``dask.config``) and validate.

        Parameters
        ----------
        spec : TableSpec
            What the table stores.
        sampler : Selector, default Uniform()
            How items are sampled.
        remover : Selector, default Fifo()
            Which items are evicted beyond ``max_size``.
        rate_limiter : RateLimiter, default MinSize(1)
            The table's limiter (a prototype).
        max_times_sampled : int, default 0
            Remove an item after this many samples (0: never; at most 2**31 - 1).
        boundary : {"strict", "pad_tail", "pad_head"}, optional
            Config ``table.boundary`` when None.
        routing : {"balanced", "round_robin"}, optional
            Config ``table.routing`` when None.
        tier : {"host", "shared", "pinned", "device", "disk"}, optional
            Config ``table.tier`` when None.
        timeout : float, optional
            Config ``table.timeout`` when None.

        Returns
        -------
        TableConfig
            The validated configuration.

        Raises
        ------
        SpecError
            An invalid value or combination (see the class docstring).
        """
        return cls(
            spec,
            Uniform() if sampler is None else sampler,
            Fifo() if remover is None else remover,
            MinSize(1) if rate_limiter is None else rate_limiter,
            max_times_sampled,
            config.get("table.boundary", boundary),
            config.get("table.routing", routing),
            config.get("table.tier", tier),
            config.get("table.timeout", timeout),
        )

    def __post_init__(self):
        if not isinstance(self.spec, TableSpec):
            raise SpecError(f"spec must be a TableSpec, got {type(self.spec).__name__}")
        for role in ("sampler", "remover"):
            sel = getattr(self, role)
            if not isinstance(sel, Selector):
                hint = ""  # the likely fix for what newcomers pass first: a class, or a name
                if isinstance(sel, type) and issubclass(sel, Selector):
                    hint = f"; call it: {role}={sel.__name__}()"
                elif isinstance(sel, str) and sel.lower() in REGISTRY:
                    hint = f"; use {role}=gear_flow.{REGISTRY[sel.lower()].__name__}()"
                raise SpecError(f"{role} must be a Selector instance, got {sel!r}{hint}")
        for role, part in (("sampler", self.sampler), ("remover", self.remover), ("rate_limiter", self.rate_limiter)):
            _check_rebuilds(role, part)
        if not self.remover.can_remove:
            raise SpecError(
                f"{self.remover!r} cannot be used as a remover; use Fifo, Lifo, MinHeap, MaxHeap, Uniform or Prioritized"
            )
        self._check_remover_honoured()
        m = self.max_times_sampled
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise SpecError(f"max_times_sampled ({m!r}) must be an integer >= 0")
        if m > MAX_TIMES_SAMPLED:  # each item's count is an int32 (as Reverb's): past it, it would wrap round
            raise SpecError(f"max_times_sampled ({m}) must be at most {MAX_TIMES_SAMPLED} (0: no limit)")
        if not isinstance(self.rate_limiter, RateLimiter):
            raise SpecError(f"rate_limiter must be a RateLimiter, got {self.rate_limiter!r}")
        self.rate_limiter.check_table(self.spec.max_size)
        if isinstance(self.rate_limiter, Queue):
            want = Lifo if isinstance(self.rate_limiter, Stack) else Fifo
            if not (isinstance(self.sampler, want) and isinstance(self.remover, want) and m == 1):
                raise SpecError(
                    f"{self.rate_limiter!r} needs sampler={want.__name__}(), remover={want.__name__}() and "
                    "max_times_sampled=1 (use LocalTable.queue / LocalTable.stack)"
                )
        if self.boundary not in BOUNDARIES:
            raise SpecError(f"boundary {self.boundary!r} must be one of {BOUNDARIES}")
        if self.routing not in ROUTINGS:
            raise SpecError(f"routing {self.routing!r} must be one of {ROUTINGS}")
        if isinstance(self.tier, str) and self.tier not in TIERS:
            raise SpecError(f"storage tier {self.tier!r} is unknown; available: {sorted(TIERS)}")
        object.__setattr__(self, "timeout", check_timeout(self.timeout))  # (frozen: inf read as its seconds)

    def _check_remover_honoured(self) -> None:
        """Refuse a remover that the storage cannot honour.

        Each shard stores its steps in one ring that overwrites its oldest steps
        once it has gone round (see :mod:`gear_flow.storage.ring`): an item lives
        at most one lap of its shard's ring, whatever the remover says.  Only a
        Fifo remover agrees with that (the ring evicts the oldest, as Fifo does).
        Lifo, heap, Uniform and Prioritized removers keep old items for good, and
        the ring would overwrite them after one lap: a silent FIFO.  The one
        exception is a Stack, whose limiter keeps the table within ``max_size``
        (its Lifo remover never runs; waiting items are protected at insert).
        """
        if isinstance(self.remover, Fifo) or isinstance(self.rate_limiter, Queue):
            return
        spec = self.spec
        raise SpecError(
            f"remover {self.remover!r} cannot be honoured by the storage: each shard's ring (capacity "
            f"{spec.capacity} steps, {spec.num_shards} shard(s), max_size {spec.max_size}) overwrites its oldest "
            "steps after one lap whatever the remover keeps, so it would act as Fifo; use remover=Fifo()"
        )

    # -- what kind of table this is (asked several times a batch; the selectors never change) ------------
    @cached_property
    def selection(self) -> str:
        """``ordered`` (Fifo, Lifo, heaps), ``epoch`` (WithoutReplacement) or ``weighted``."""
        if self.sampler.deterministic:
            return "ordered"
        return "epoch" if getattr(self.sampler, "without_replacement", False) else "weighted"

    @cached_property
    def plan(self) -> str:
        """The sample plan (:func:`gear_flow.table.planner.sample`): the selection; with ``max_times_sampled``
        ``sequential`` for a weighted sampler (drawn item by item, as Reverb), ``ordered_limited`` for an
        ordered one and ``epoch_limited`` for an epoch one (a batch the items left cannot fill waits)."""
        if self.max_times_sampled > 0 and self.selection in ("weighted", "ordered", "epoch"):
            return {"weighted": "sequential", "ordered": "ordered_limited", "epoch": "epoch_limited"}[self.selection]
        return self.selection

    @property
    def lossless(self) -> bool:
        """Every item must be handed out (Queue, Stack): storage may never overwrite a waiting item."""
        return isinstance(self.rate_limiter, Queue)

    def evicts_to_max_size(self, size: int) -> bool:
        """Whether a table holding ``size`` items drops items back to ``max_size`` (both tables' one rule).

        A queue or stack never does: its limiter bounds the items waiting, and
        each of them is to be handed out.  It goes over ``max_size`` when a
        sample it granted (counted out at the grant, so inserts were admitted
        into the room of the items it was to expire) gives its admission back
        instead (its worker lost, a refusal, too few items left): those items
        still wait, and are the oldest, the very ones its remover would drop.
        Its limiter holds further inserts back until samples have taken the
        excess.

        Parameters
        ----------
        size : int
            Items in the table after an insert.

        Returns
        -------
        bool
            True when ``size`` is over ``max_size`` and the table may drop items.

        Examples
        --------
        >>> from gear_flow import ColumnSpec, TableSpec
        >>> spec, args = queue_setup(TableSpec((ColumnSpec("x", ()),), capacity=8), 4)
        >>> TableConfig.build(spec, **args).evicts_to_max_size(6)
        False
        >>> TableConfig.build(TableSpec((ColumnSpec("x", ()),), capacity=8, max_size=4)).evicts_to_max_size(6)
        True
        """
        return size > self.spec.max_size and not self.lossless

    def check_sample_size(self, n: int) -> None:
        """Reject a sample of ``n`` items that could never be admitted or filled.

        Parameters
        ----------
        n : int
            Items in the sample.

        Raises
        ------
        SpecError
            The limiter could never admit it (:meth:`RateLimiter.check_sample_size`), or, with
            ``max_times_sampled`` on a table that evicts down to ``max_size`` (not a Queue or Stack, which
            keep every item an insert brings), it asks for more rows than its items could ever give
            (``max_size * max_times_sampled``): it would wait for inserts forever, first in line.
        """
        self.rate_limiter.check_sample_size(n)
        most = self.spec.max_size * self.max_times_sampled
        if self.max_times_sampled and not self.lossless and n > most:  # (a queue keeps what an insert brings)
            raise SpecError(
                f"a sample of {n} items can never be filled: the table holds at most {self.spec.max_size} items "
                f"(max_size) and each is handed out at most {self.max_times_sampled} times (max_times_sampled), "
                f"{most} rows in all; sample fewer"
            )

    def check_priorities(self, priorities: np.ndarray) -> None:
        """Reject (validated, finite, >= 0) priorities that the sampler or remover cannot represent.

        Parameters
        ----------
        priorities : numpy.ndarray
            float64 priorities, already checked finite and >= 0.

        Raises
        ------
        InvalidPriorityError
            A priority the sampler or remover cannot represent (e.g. one that
            overflows ``p ** alpha`` of a Prioritized sampler).
        """
        self.sampler.check_priorities(priorities, "sampler")
        self.remover.check_priorities(priorities, "remover")

    @property
    def beta(self) -> float:
        """Importance-weight exponent (0 when the sampler has none)."""
        return float(getattr(self.sampler, "beta", 0.0)) if getattr(self.sampler, "importance_weighted", False) else 0.0

    @cached_property
    def exclusive(self) -> bool:
        """Samples change what later samples may take (expiry, epochs, queue order): run one at a time.

        Two samplers running at once could otherwise both take an item that may
        be handed out only once, or an epoch could lose items on a retry.
        """
        return self.max_times_sampled > 0 or self.selection == "epoch"

    # -- JSON form (checkpoints, the wire) ---------------------------------------------------------
    def to_dict(self) -> dict:
        """The JSON form (checkpoints, the wire); :meth:`from_dict` reads it back.

        Returns
        -------
        dict
            ``spec`` (:meth:`TableSpec.to_dict`), ``sampler`` and ``remover``
            (selector configs), ``rate_limiter`` (limiter config, counts
            included), ``max_times_sampled``, ``boundary``, ``routing``,
            ``tier`` (its name) and ``timeout``.
        """
        return {
            "spec": self.spec.to_dict(),
            "sampler": selector_to_config(self.sampler),
            "remover": selector_to_config(self.remover),
            "rate_limiter": limiter_to_config(self.rate_limiter),
            "max_times_sampled": self.max_times_sampled,
            "boundary": self.boundary,
            "routing": self.routing,
            "tier": getattr(self.tier, "name", self.tier),
            "timeout": self.timeout,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TableConfig:
        """Rebuild and validate a configuration from :meth:`to_dict`'s form.

        Missing optional keys take their defaults (``strict``, ``balanced``,
        ``host``, no timeout, ``max_times_sampled`` 0).

        Parameters
        ----------
        d : dict
            As :meth:`to_dict` writes it.

        Returns
        -------
        TableConfig
            The validated configuration.

        Raises
        ------
        SpecError
            ``d`` is not a table configuration, or describes an invalid one.
        """
        try:
            return cls(
                TableSpec.from_dict(d["spec"]),
                selector_from_config(d["sampler"]),
                selector_from_config(d["remover"]),
                limiter_from_config(d["rate_limiter"]),
                int(d.get("max_times_sampled", 0)),
                d.get("boundary", "strict"),
                d.get("routing", "balanced"),
                d.get("tier") or "host",
                d.get("timeout"),
            )
        except (KeyError, TypeError) as e:
            raise SpecError(f"not a table configuration ({type(e).__name__}: {e})") from None

    def fresh_limiter(self) -> RateLimiter:
        """A new limiter with this configuration's parameters and zero counts.

        Returns
        -------
        RateLimiter
            Shares no state with :attr:`rate_limiter` (a limiter given to two
            tables counts for each separately).
        """
        return limiter_from_config(limiter_to_config(self.rate_limiter))


def queue_setup(spec: TableSpec, size: int, lifo: bool = False) -> tuple[TableSpec, dict]:
    """The spec and table arguments of a FIFO queue (``lifo``: a stack) of ``size`` items.

    Each item is sampled once (``max_times_sampled=1``), in order; inserts block
    when ``size`` items wait.  Every table kind builds its queues from this.

    Parameters
    ----------
    spec : TableSpec
        Columns and shards of the queue.
    size : int
        Items the queue holds at most.
    lifo : bool, default False
        A stack (newest first) instead of a queue.

    Returns
    -------
    spec : TableSpec
        ``spec`` with ``max_size=size``.
    args : dict
        ``sampler``, ``remover`` (``Fifo()`` or ``Lifo()``), ``rate_limiter``
        (``Queue(size)`` or ``Stack(size)``) and ``max_times_sampled=1``.

    Raises
    ------
    SpecError
        ``size`` is not a positive integer.
    """
    sel, lim = (Lifo, Stack) if lifo else (Fifo, Queue)
    spec = TableSpec(spec.columns, spec.capacity, spec.num_shards, spec.item_unit, size)
    return spec, {"sampler": sel(), "remover": sel(), "rate_limiter": lim(size), "max_times_sampled": 1}


def _check_rebuilds(role: str, part: object) -> None:
    """Refuse a selector or limiter that its own ``params()`` cannot rebuild: each shard gets
    ``type(part)(**part.params())``, and checkpoints and distributed tables carry the params as JSON.  A
    subclass whose ``params()`` were not its constructor's arguments failed with a bare TypeError in the
    shards' construction (a disk table's files half made), params that were not JSON at its first
    checkpoint, naming neither."""
    if not isinstance(part, (Selector, RateLimiter)):
        return  # (refused with its own message by the caller)
    try:
        params = part.params()
        json.dumps(params)
        type(part)(**params)
    except (TypeError, ValueError) as e:
        raise SpecError(
            f"{role} {type(part).__name__}: its params() must be JSON-able keyword arguments of its constructor "
            f"that rebuild it ({e})"
        ) from None
