"""The worker's selection answers: what its shards hold, as the planner asks before it draws or evicts.

``summaries`` gives one number per shard and kind (sampling or removal mass,
size, valid windows, unseen items of an epoch), ``candidates`` the best items
of each shard for an ordered selector (merged across shards by the client),
and ``new_epoch`` starts a new epoch on every shard.  They gather nothing and
change nothing but epochs, and serve samples and evictions alike (the
planner's ``Summaries``, ``Candidates`` and ``NewEpoch`` requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ProtocolError
from ..table import planner
from ..table.executor import InProcess, summary

if TYPE_CHECKING:
    from .host_tables import HostedTables


class HostSelection:
    """The planner's questions that gather nothing, answered over the tables a worker hosts.

    Parameters
    ----------
    tables : HostedTables
        The worker's hosted tables.

    Examples
    --------
    >>> from gear_flow import ColumnSpec, TableSpec
    >>> from gear_flow.distributed.host_tables import HostedTables
    >>> from gear_flow.table.config import TableConfig
    >>> tables = HostedTables()
    >>> tables.create("t", TableConfig.build(TableSpec((ColumnSpec("x", ()),), capacity=8)).to_dict(), [0])
    [0]
    >>> HostSelection(tables).summaries("t", ("size",))
    {'size': {0: 0.0}}
    """

    def __init__(self, tables: HostedTables) -> None:
        self.tables = tables

    def summaries(
        self, name: str, kinds: Sequence[str], length: int | None = None, boundary: str | None = None
    ) -> dict[str, dict[int, float]]:
        """One number per shard and kind, as a plan asks (:class:`planner.Summaries`).

        Parameters
        ----------
        name : str
            The table.
        kinds : sequence of str
            ``sampler`` (sampling mass of the windows that fit), ``unseen``
            (epoch items left), ``remover`` (remover mass), ``size``, ``valid``
            (items whose window fits), ``goes`` (the times those may still go).
        length : int, optional
            Window length (default 1).
        boundary : str, optional
            Boundary mode (default ``pad_tail``).

        Returns
        -------
        dict
            ``{kind: {shard: value}}`` over this worker's shards of the table.

        Raises
        ------
        ProtocolError
            ``sampler``/``unseen`` of an ordered table, or ``unseen`` of a
            table without epochs.
        SpecError
            No table ``name`` on this worker.
        """
        t = self.tables.table(name)
        if ("sampler" in kinds or "unseen" in kinds) and t.cfg.selection == "ordered":
            raise ProtocolError(f"worker 'summaries': table {name!r} has an ordered sampler, no sampling mass")
        if "unseen" in kinds and t.cfg.selection != "epoch":
            raise ProtocolError(f"worker 'summaries': table {name!r} samples without epochs (no 'unseen')")
        length, boundary = length or 1, boundary or "pad_tail"
        return {k: {i: summary(s, k, length, boundary) for i, s in t.shards.items()} for k in kinds}

    def new_epoch(self, name: str, txn: str | None = None) -> None:
        """Start a new epoch on every shard of ``name`` here (WithoutReplacement: all items unseen again).

        Parameters
        ----------
        name : str
            The table.
        txn : str, optional
            The sample (gathered first, counted at its finish) whose batch
            goes on in the new epoch: the items its pending parts here drew
            as often as they may still go stay out of it.
        """
        t = self.tables.table(name)
        drawn = t.txns.pending_slots(txn) if txn is not None else {}
        for i, s in t.shards.items():
            s.new_epoch(drawn.get(i))

    def candidates(
        self,
        name: str,
        n: int,
        role: str | None = None,
        length: int | None = None,
        boundary: str | None = None,
        horizon: int | None = None,
    ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """The best ``n`` items of each shard for an ordered selector, for a global merge.

        Parameters
        ----------
        name : str
            The table.
        n : int
            Candidates per shard at most.
        role : {"sampler", "remover"}, optional
            Whose order (default ``sampler``).
        length : int, optional
            Window length; sampler candidates must fit it (default 1).
        boundary : str, optional
            Boundary mode (default ``pad_tail``).
        horizon : int, optional
            Only items stamped before it (the oldest insert in flight).

        Returns
        -------
        dict
            ``{shard: (slots, order_keys)}``, best first; the remover's
            ``{shard: (slots, order_keys, seqs)}``, with the seq of each
            victim (a removal spares a slot written over since).

        Raises
        ------
        ProtocolError
            The selector of ``role`` is not ordered.
        """
        t = self.tables.table(name)
        role = role or "sampler"
        sel = t.cfg.sampler if role == "sampler" else t.cfg.remover
        if not sel.deterministic:
            raise ProtocolError(f"worker 'candidates': the {role} of table {name!r} ({sel!r}) is not ordered")
        if role == "remover":
            return {i: s.remover_candidates(int(n), seqs=True) for i, s in t.shards.items()}
        ex = InProcess(t.shards, None, None, length or 1, boundary or "pad_tail", horizon=horizon)
        return ex(planner.Candidates(int(n), role))
