"""Checkpoints of a worker's host: snapshot, restore and hand-over of local shards.

``checkpoint`` writes every hosted shard of a table to a checkpoint directory
(each under its own lock), ``restore`` builds shards from one, and
``drop_shard`` forgets a shard that was restored on another worker.

:class:`CheckpointingHost` is a mixin of :class:`~gear_flow.distributed.host.ShardHost`
rather than a class of its own because these methods replace and remove the
host's tables under its lock, and the worker plugin calls them as
``ShardHost.<method>``; keeping them here keeps the checkpoint path readable
on its own.
"""

from __future__ import annotations

import os

from ..table.config import TableConfig


class CheckpointingHost:
    """Checkpoint methods of :class:`~gear_flow.distributed.host.ShardHost` (needs ``table``, ``tables``, ``lock``)."""

    # -- checkpoints --------------------------------------------------------------------------
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
        for i, s in sorted(self.table(name).shards.items()):
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
        are kept.  Every file is verified before any shard is built.

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
        from .host import HostedTable  # not at the top: host.py imports this module for ShardHost's bases

        cfg = TableConfig.from_dict(config)
        loaded = {int(i): ck.read_shard_file(Path(directory), e["file"], e["sha256"]) for i, e in files.items()}
        with self.lock:
            old = self.tables.get(name)
            have = set(old.shards) if old is not None else set()
            t = HostedTable(name, cfg, sorted(loaded), tier)
            for i in loaded:
                ck.restore_shard(t.shards[i], loaded[i], files[i]["meta"])
            for i in have - set(loaded):  # keep shards this worker already hosts
                t.shards[i] = old.shards[i]
            self.tables[name] = t
        return {i: t.shards[i].size for i in loaded}

    def drop_shard(self, name: str, shard: int) -> bool:
        """Forget one shard of a table here (it was restored on another worker).

        Parameters
        ----------
        name : str
            The table's name.
        shard : int
            The shard's id.

        Returns
        -------
        bool
            Whether the shard was here.
        """
        with self.lock:
            t = self.tables.get(name)
            if t is None or int(shard) not in t.shards:
                return False
            t.release([int(shard)])
            return t.shards.pop(int(shard)) is not None
