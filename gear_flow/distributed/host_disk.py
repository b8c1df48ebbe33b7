"""The worker's part that serves a disk table's files: reopening a lost shard's in place, and flushing them.

Where a disk shard's files are and how they are checked, reopened and let go
is :mod:`~gear_flow.distributed.disk_files`; this part answers the
``reopen`` and ``flush_disk`` requests over the worker's hosted tables.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SpecError
from ..shard import Shard
from ..table.config import TableConfig
from . import disk_files
from .host_tables import HostedTable

if TYPE_CHECKING:
    from .host_tables import HostedTables


class HostDisk:
    """The disk shards of the tables a worker hosts: reopening a lost shard's files in place, and flushing.

    Parameters
    ----------
    tables : HostedTables
        The worker's hosted tables.

    Examples
    --------
    >>> from gear_flow.distributed.host_tables import HostedTables
    >>> disk = HostDisk(HostedTables())
    """

    def __init__(self, tables: HostedTables) -> None:
        self.tables = tables

    def reopen(self, name: str, config: dict, directory: str | os.PathLike[str], shard: int) -> dict:
        """Host shard ``shard`` of table ``name`` again, reopened in place from its files (a lost shard).

        Nothing is copied: the shard maps the files its worker left (pages
        are read when sampled).  Every check of :func:`~gear_flow.distributed.disk_files.open_shard` passes
        before the shard is hosted; a failure leaves nothing hosted and the
        files as they were.  From then on the files are the table's here
        (dropping the table removes them).

        Parameters
        ----------
        name : str
            The table's name.
        config : dict
            Its configuration (:meth:`TableConfig.to_dict`, plus the
            distributed table's settings).
        directory : str or os.PathLike
            The table's directory (``<root>/<name>``) or the shard's own,
            as this worker sees it.
        shard : int
            The shard's id.

        Returns
        -------
        dict
            ``size`` (items), ``inserted`` (its counter: every insert it
            committed), ``recovered`` (what reopening repaired:
            :attr:`DiskStore.recovered <gear_flow.storage.disk_state.DiskStore.recovered>`),
            ``seconds`` (the checks and the reopen) and ``directory`` (str).

        Raises
        ------
        CheckpointError
            No shard's files there, or they fail a check.
        SpecError
            The shard is hosted here already, or another hosted shard maps
            those files.
        """
        t0 = time.perf_counter()
        shard = int(shard)
        cfg = TableConfig.from_dict(config)
        d = disk_files.shard_directory(directory, shard)
        disk_files.check_files(cfg, shard, d)
        built: dict[int, Shard] = {}

        def build(t) -> dict[int, Shard]:  # (under the registry's lock: no other reopen maps them meanwhile)
            if shard in t.shards:
                raise SpecError(f"shard {shard} of table {name!r} is hosted on this worker already")
            self._refuse_in_use(d)
            built[shard] = disk_files.open_shard(t, shard, d, checked=True)
            return dict(built)

        self.tables.adopt(name, lambda: HostedTable.from_config(name, config, []), build)
        s = built[shard]
        return {
            "size": int(s.size),
            "inserted": int(s.counters.inserted),
            "recovered": dict(s.store.recovered),
            "seconds": time.perf_counter() - t0,
            "directory": str(d),
        }

    def _refuse_in_use(self, d: Path) -> None:
        """Refuse files a shard hosted here maps already (two mappings writing one shard would corrupt it)."""
        for tname in list(self.tables):
            t = self.tables.get(tname)
            for i, s in list(t.shards.items()) if t is not None else ():
                if s.store is not None and s.tier.directory == d:
                    raise SpecError(f"{d} is in use by shard {i} of table {tname!r} on this worker; not reopened")

    def flush(self, name: str) -> dict:
        """Make every disk shard of table ``name`` hosted here durable (each under its lock, one at a time).

        Parameters
        ----------
        name : str
            The table's name.

        Returns
        -------
        dict of int to int
            Bytes checksummed per shard.

        Raises
        ------
        SpecError
            No table ``name`` here, or it is not on the ``disk`` tier.
        """
        t = self.tables.table(name)
        if not disk_files.is_disk(t.tier):
            raise SpecError(f"table {name!r} is on the {getattr(t.tier, 'name', t.tier)!r} tier, not 'disk'")
        out = {}
        for i, s in sorted(t.shards.items()):
            with s.lock:
                out[i] = int(s.store.flush()["bytes_checksummed"])
        return out
