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
        SpecError
            A disk table's shard cannot have new files here (no directory
            for disk tables, or its directory holds a shard already).
        """
        from pathlib import Path

        from .. import checkpoint as ck

        cfg = TableConfig.from_dict(config)
        loaded = {int(i): ck.read_shard_file(Path(directory), e["file"], e["sha256"]) for i, e in files.items()}

        def build(t: HostedTable) -> dict:
            built = {}
            try:
                for i in loaded:
                    built[i] = t.build_shard(i)
                    ck.restore_shard(built[i], loaded[i], files[i]["meta"])
            except BaseException:
                t.release_shards(built.values())
                raise
            return built

        def fresh() -> HostedTable:
            return HostedTable(name, cfg, [], tier, disk_path=config.get("disk_path"))

        t = self.tables.adopt(name, fresh, build)
        return {i: t.shards[i].size for i in loaded}
