"""The worker's checkpoints: writing the shards it hosts to a checkpoint directory, and building them from one.

``checkpoint`` writes every hosted shard of a table (each under its own lock);
``restore`` builds shards from a checkpoint, keeping the table's other shards
here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..table.config import TableConfig
from .host_tables import HostedTable

if TYPE_CHECKING:
    from .host_tables import HostedTables


class HostCheckpointer:
    """Checkpoints of the tables a worker hosts.

    Parameters
    ----------
    tables : HostedTables
        The worker's hosted tables.

    Examples
    --------
    >>> from gear_flow.distributed.host_tables import HostedTables
    >>> checkpointer = HostCheckpointer(HostedTables())
    """

    def __init__(self, tables: HostedTables) -> None:
        self.tables = tables

    def checkpoint(self, name: str, directory: str | os.PathLike[str]) -> dict:
        """Snapshot every hosted shard (under its lock) and write it to ``directory``.

        Parameters
        ----------
        name : str
            The table's name.
        directory : str or os.PathLike
            An existing directory (the checkpoint's temporary one).

        Returns
        -------
        dict
            ``{shard: {"file": name, "sha256": hex digest, "meta": counters
            and state, "pause_s": seconds the shard was held}}``.
        """
        import time
        from pathlib import Path

        from .. import checkpoint as ck

        out = {}
        for i, s in sorted(self.tables.table(name).shards.items()):
            t0 = time.perf_counter()
            arrays, meta = ck.snapshot_shard(s)
            pause = time.perf_counter() - t0
            f, digest = ck.write_shard_file(Path(directory), i, arrays)
            out[i] = {"file": f, "sha256": digest, "meta": meta, "pause_s": pause}
        return out

    def restore(
        self, name: str, config: dict, directory: str | os.PathLike[str], files: dict, tier: str | None = None
    ) -> dict:
        """Create the table's shards ``files`` here from a checkpoint directory.

        Shards already hosted are replaced; other hosted shards of the table
        are kept, and so are its inserts staged and samples pending here (a
        pending sample's parts drawn from a replaced shard finish on the copy
        they were drawn from).  Every file is verified before any shard is
        built.

        Parameters
        ----------
        name : str
            The table's name.
        config : dict
            Its configuration (:meth:`TableConfig.to_dict`).
        directory : str or os.PathLike
            The checkpoint directory.
        files : dict
            ``{shard: manifest entry}`` (``file``, ``sha256``, ``meta``).
        tier : str, optional
            Storage tier; default the configuration's.

        Returns
        -------
        dict of int to int
            Items restored per shard.

        Raises
        ------
        CheckpointError
            A file is missing or fails verification.
        """
        from pathlib import Path

        from .. import checkpoint as ck

        cfg = TableConfig.from_dict(config)
        loaded = {int(i): ck.read_shard_file(Path(directory), e["file"], e["sha256"]) for i, e in files.items()}

        def build(old: HostedTable | None) -> HostedTable:
            if old is None:
                t = HostedTable(name, cfg, sorted(loaded), tier)
                for i in loaded:
                    ck.restore_shard(t.shards[i], loaded[i], files[i]["meta"])
                return t
            # restored into the table hosted here, not a new one: its inserts staged and its two-phase samples
            # drawn on the other shards go on (a new table's memory would answer their apply and finish as
            # unknown, and a queue's items handed out would never expire)
            built = {i: old.build_shard(i) for i in loaded}
            try:
                for i, s in built.items():
                    ck.restore_shard(s, loaded[i], files[i]["meta"])
            except BaseException:
                old.release_shards(built.values())
                raise
            with old.lock:
                replaced = {i: old.shards[i] for i in built if i in old.shards}
                old.txns.retire(replaced)
                old.shards.update(built)
            old.release_shards(replaced.values())
            return old

        t = self.tables.replace(name, build)
        return {i: t.shards[i].size for i in loaded}
