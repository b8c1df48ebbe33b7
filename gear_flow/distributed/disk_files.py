"""A disk shard's files on a worker: where they are, checking and reopening them, letting them go.

A distributed table on the ``disk`` tier keeps each shard in
``<root>/<table>/shard-<id>`` on the local disk of the worker that hosts it
(one :class:`~gear_flow.storage.disk.DiskTier` per shard), ``root`` being the
table's own ``path`` (``DistributedTable.create(..., path=...)``, the same for
every worker) or else the worker's config ``gear-flow.disk.path``, read on the
worker.  A worker with neither cannot host a disk shard: creating the table
there fails (:func:`new_tier`).

The files are the shard's checkpoint (:mod:`gear_flow.storage.disk_state`): a
worker that can see them reopens them in place (:func:`open_shard`; what
``restore_shard`` of a lost disk shard asks, :mod:`~gear_flow.distributed.host_disk`),
and a move to a worker on the same machine hands them over instead of copying
the shard (:mod:`~gear_flow.distributed.host_moves`).

Why a worker lets a disk shard go decides what becomes of its files
(:func:`let_go`):

- :data:`REMOVE` -- the table is dropped, the shard was replaced, or it lives
  on another machine now (a move copied it there): the files go, as a memory
  tier's memory would;
- :data:`FLUSH` -- the worker closes with the shard still the table's: the
  files are made durable and stay, for a later in-place reopen;
- :data:`KEEP` -- another process maps the same files (the other end of an
  in-place move), or they were never this worker's to remove (a reopen that
  failed): only the mappings go.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import config as gf_config
from ..errors import CheckpointError, SpecError
from ..shard import Shard
from ..table.config import TableConfig

if TYPE_CHECKING:
    from ..storage.disk import DiskTier
    from .host_tables import HostedTable

logger = logging.getLogger(__name__)

#: letting a disk shard go: only its mappings go (another process maps its files, or will)
KEEP = "keep"
#: ... its files made durable first and kept (the worker closes; the shard is still the table's)
FLUSH = "flush"
#: ... and its directory removed (the table is dropped, or the shard lives elsewhere now)
REMOVE = "remove"
FILES = (KEEP, FLUSH, REMOVE)


def is_disk(tier: object) -> bool:
    """Whether ``tier`` (a name or a storage tier) is the ``disk`` tier.

    Parameters
    ----------
    tier : str or StorageTier
        A tier.

    Returns
    -------
    bool
        True for ``"disk"`` and :class:`~gear_flow.storage.disk.DiskTier` instances.
    """
    return getattr(tier, "name", tier) == "disk"


def table_directory(name: str, disk_path: str | None) -> Path:
    """Where this worker keeps the shards of disk table ``name``: ``<root>/<name>``.

    Parameters
    ----------
    name : str
        The table's name.
    disk_path : str, optional
        The table's own root (``path`` given to ``create``); None: this
        worker's config ``gear-flow.disk.path``.

    Returns
    -------
    pathlib.Path
        The directory (absolute; not created here).

    Raises
    ------
    SpecError
        Neither is set on this worker.
    """
    root = gf_config.get("disk.path", disk_path)
    if root is None:
        raise SpecError(
            f"disk table {name!r} needs a directory on every worker that hosts a shard: this worker has none "
            "(set gear-flow.disk.path on the workers, or pass path= to DistributedTable.create)"
        )
    return Path(str(root)).absolute() / name


def new_tier(name: str, disk_path: str | None, shard: int) -> DiskTier:
    """The files of a new, empty shard ``shard`` of disk table ``name``, in ``<root>/<name>/shard-<id>``.

    Parameters
    ----------
    name : str
        The table's name.
    disk_path : str, optional
        The table's own root, as :func:`table_directory` takes it.
    shard : int
        The shard's id.

    Returns
    -------
    DiskTier
        Creating its files.

    Raises
    ------
    SpecError
        This worker has no directory for disk tables, or the shard's
        directory holds a shard already (an earlier table of that name left
        it: reopen it with ``restore_shard`` or remove it).
    """
    from ..storage.disk import DiskTier

    d = table_directory(name, disk_path) / f"shard-{int(shard)}"
    if (d / "layout.json").exists():
        raise SpecError(
            f"{d} already holds the files of a shard {shard} of a table named {name!r}: reopen them "
            f"(restore_shard({shard}, {str(d.parent)!r})), remove them, or choose another name or path"
        )
    return DiskTier(d)


def shard_directory(directory: str | os.PathLike[str], shard: int) -> Path:
    """The directory of disk shard ``shard`` under ``directory``: a table's (``<dir>/shard-<id>``) or the shard's own.

    Parameters
    ----------
    directory : str or os.PathLike
        A disk table's directory on this worker (``<root>/<name>``) or a
        shard's directory.
    shard : int
        The shard's id.

    Returns
    -------
    pathlib.Path
        The shard's directory, absolute.

    Raises
    ------
    CheckpointError
        Neither holds a disk shard (no ``layout.json``).
    """
    d = Path(directory).absolute()
    for cand in (d / f"shard-{int(shard)}", d):
        if (cand / "layout.json").exists():
            return cand
    raise CheckpointError(
        f"{d} holds no disk shard {shard} (neither {d.name}/shard-{shard}/layout.json nor {d.name}/layout.json)"
    )


def _layout_table(cfg: TableConfig) -> dict[str, Any]:
    """What a disk shard of a table with configuration ``cfg`` records as its table (JSON-normalised)."""
    from ..selectors import to_config

    d = {
        "spec": cfg.spec.to_dict(),
        "sampler": to_config(cfg.sampler),
        "remover": to_config(cfg.remover),
        "max_times_sampled": cfg.max_times_sampled,
    }
    return json.loads(json.dumps(d))


def check_files(cfg: TableConfig, shard: int, directory: str | os.PathLike[str]) -> None:
    """Check, without mapping them, that the files in ``directory`` are shard ``shard`` of a table like ``cfg``.

    First everything :func:`gear_flow.storage.disk_state.check` checks
    (layout checksum, header CRC, version, every file's size), then the
    shard's id and its table's spec and selectors.

    Parameters
    ----------
    cfg : TableConfig
        The table's configuration.
    shard : int
        The shard's id.
    directory : str or os.PathLike
        The shard's own directory.

    Raises
    ------
    CheckpointError
        A check fails (named), or the files are another shard's or another
        table's.
    """
    from ..storage import disk_state

    d = Path(directory).absolute()
    layout, _ = disk_state.check(d)
    if layout.get("shard") != int(shard):
        raise CheckpointError(f"{d} holds shard {layout.get('shard')}, not shard {shard}")
    if layout.get("table") != _layout_table(cfg):
        raise CheckpointError(f"{d} holds a shard of a table with another spec or selectors than this one")


def open_shard(table: HostedTable, shard: int, directory: str | os.PathLike[str], checked: bool = False) -> Shard:
    """Shard ``shard`` of ``table``, reopened in place from its files in ``directory`` (not hosted by it yet).

    The files are checked first (:func:`check_files`); the shard then takes
    its state from the header and recovers from an insert cut short
    (:class:`~gear_flow.storage.disk_state.DiskStore`).

    Parameters
    ----------
    table : HostedTable
        The table it is a shard of (its configuration).
    shard : int
        The shard's id.
    directory : str or os.PathLike
        The shard's own directory.
    checked : bool, default False
        The caller ran :func:`check_files` already.

    Returns
    -------
    Shard
        The shard, its files mapped (its ``store.recovered`` says what
        reopening repaired).

    Raises
    ------
    CheckpointError
        A check fails, or the files are another shard's or another table's;
        nothing stays mapped.
    """
    from ..storage.disk import DiskTier

    d = Path(directory).absolute()
    if not checked:
        check_files(table.cfg, shard, d)
    tier = DiskTier(d, create=False)
    try:
        return table.make_shard(shard, tier)
    except BaseException:
        tier.release()
        raise


def let_go(shard: Shard, files: str) -> None:
    """Forget disk shard ``shard``'s mappings; ``files`` says what becomes of its files (the module docstring).

    Parameters
    ----------
    shard : Shard
        A disk shard (one whose ``store`` is set).
    files : {"keep", "flush", "remove"}
        :data:`KEEP`, :data:`FLUSH` or :data:`REMOVE`.
    """
    if files not in FILES:
        raise ValueError(f"files ({files!r}) must be one of {FILES}")
    tier = shard.tier
    with shard.lock:
        if files == FLUSH:
            try:
                shard.store.flush()
            except OSError as e:  # the worker closes anyway: the last commit is in the page cache
                logger.warning("disk shard %s not flushed: %s", tier.directory, e)
        tier.release()
    if files == REMOVE:
        remove_files(tier.directory)


def remove_files(directory: str | os.PathLike[str]) -> None:
    """Remove a disk shard's directory, and its table's directory when it was the last shard there.

    Parameters
    ----------
    directory : str or os.PathLike
        The shard's directory.
    """
    d = Path(directory)
    shutil.rmtree(d, ignore_errors=True)
    try:  # the table's directory goes with its last shard (one still holding anything stays)
        d.parent.rmdir()
    except OSError:
        pass
