"""Checkpoints of shards and tables: atomic, checksummed, versioned, no pickle.

Layout of a checkpoint directory::

    manifest.json                 format version, table configuration, limiter state,
                                  counters, and for every file its SHA-256
    shard-<id>.npz                every array of one shard (np.savez, allow_pickle=False)

A shard is *snapshotted* under its lock (a memory copy of its arrays: the
only pause writers and samplers see), then written outside the lock, so
sampling and inserting continue while the files are written.  Files go to a
temporary directory that is fsync'ed and atomically renamed into place (over
an older checkpoint: exchanged with it); a
reader verifies every checksum and the format version before touching a table,
and a mismatch (corruption, other version, other columns or capacity) raises
:class:`~gear_flow.errors.CheckpointError`.  What a writer killed mid-way left
beside the path is removed by the next checkpoint to it, or put in place when
it is a whole checkpoint that a kill kept from its place.

Checkpoints hold the replay data itself, so they are private by default: files
are created ``0600`` and directories ``0700`` (whatever the umask), set by
``gear-flow.checkpoint.file-mode`` / ``dir-mode`` (octal strings, e.g. ``"0640"``
and ``"0750"`` to share with a group).  On a cluster the workers write the
shard files into the directory the caller created: run them as the same user,
or give both a group and group-writable ``dir-mode``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import CheckpointError

if TYPE_CHECKING:
    from .shard import Shard

FORMAT = "gear-flow-checkpoint"
VERSION = 1


def _mode(key: str) -> int:
    """``gear-flow.checkpoint.<key>`` as a permission mode (octal string such as ``"0600"``, or an int)."""
    from . import config

    value = config.get(f"checkpoint.{key}")
    try:
        mode = int(value, 8) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        mode = -1
    if (
        not 0 <= mode <= 0o777
        or (key == "file-mode" and mode & 0o600 != 0o600)
        or (key == "dir-mode" and mode & 0o700 != 0o700)
    ):
        who = "owner rw (0600)" if key == "file-mode" else "owner rwx (0700)"
        raise CheckpointError(
            f"gear-flow.checkpoint.{key} ({value!r}) must be an octal permission string like "
            f"{'0600' if key == 'file-mode' else '0700'} that keeps {who}"
        )
    return mode


def file_mode() -> int:
    """Permissions of checkpoint files (``gear-flow.checkpoint.file-mode``, default 0600).

    Returns
    -------
    int
        The mode, e.g. ``0o600``.

    Raises
    ------
    CheckpointError
        The configured value is not an octal mode up to 0777, or does not
        keep the owner's read and write bits.
    """
    return _mode("file-mode")


def dir_mode() -> int:
    """Permissions of checkpoint directories (``gear-flow.checkpoint.dir-mode``, default 0700).

    Returns
    -------
    int
        The mode, e.g. ``0o700``.

    Raises
    ------
    CheckpointError
        The configured value is not an octal mode up to 0777, or does not
        keep the owner's rwx bits.
    """
    return _mode("dir-mode")


def _create(path: Path, mode: int):
    """A new file opened for binary writing with exactly ``mode`` (not widened by the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it, and the file may have existed
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


def snapshot_shard(shard: Shard) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Copy a shard's state (arrays, metadata) under its lock.

    The copy is what blocks the shard; measure it with :func:`time.perf_counter`
    around this call (``LocalTable.checkpoint`` reports it as ``pause_s``).

    Parameters
    ----------
    shard : Shard
        An in-process shard, on any storage tier.

    Returns
    -------
    arrays : dict of str to numpy.ndarray
        Host copies: ``col_<name>`` per column, ``active``, ``priority``,
        ``touched``, ``episode_<field>`` of the live episodes, and where the
        shard has them ``step_episode``, ``times_sampled``,
        ``sampler_tree``/``remover_tree``.
    meta : dict
        JSON-able scalars: ``shard``, ``write_pos``, ``episodes_first``,
        ``episodes_next``, ``size``, ``max_priority``, ``counters``, ``epoch``.
    """
    with shard.lock:
        idx = shard.index
        live = idx.live()
        # through the tier: a device ring is read after the fence of its last write (inserts may
        # have been issued on another stream), not with a bare copy on this thread's stream
        arrays = {f"col_{n}": shard.ring.read(n, 0, shard.capacity) for n in shard.ring.columns}
        arrays.update(
            active=shard.active.copy(),
            priority=shard.priority.copy(),
            touched=shard.touched.copy(),
            **{f"episode_{f}": idx.get(f, live) for f in ("start", "length", "stamp", "episode_id")},
        )
        if shard.step_episode is not None:
            arrays["step_episode"] = shard.step_episode.copy()
        if shard.times_sampled is not None:
            arrays["times_sampled"] = shard.times_sampled.copy()
        for role in ("sampler", "remover"):
            sel = getattr(shard, role)
            if getattr(sel, "tree", None) is not None:
                arrays[f"{role}_tree"] = sel.tree_state()  # a host copy, wherever the tree lives
        meta = {
            "shard": shard.shard_id,
            "write_pos": int(shard.ring.write_pos),
            "episodes_first": int(idx.first),
            "episodes_next": int(idx.next),
            "size": int(shard.size),
            "max_priority": float(shard.max_priority),
            "counters": shard.counters.as_dict(),
            "epoch": int(getattr(shard.sampler, "epoch", 0)),
        }
    return arrays, meta


def restore_shard(shard: Shard, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Load a snapshot into a freshly built, empty shard of the same spec.

    Parameters
    ----------
    shard : Shard
        The shard to fill, built with the checkpoint's spec, capacity,
        selectors; changed in place under its lock.
    arrays : dict of str to numpy.ndarray
        As :func:`snapshot_shard` returned them (or :func:`read_shard_file` read them).
    meta : dict
        As :func:`snapshot_shard` returned it.

    Raises
    ------
    CheckpointError
        A column's dtype or shape, the capacity, or a selector's state does
        not match the shard.
    """
    from .shard import Counters

    with shard.lock, shard.writing():
        cap = shard.capacity
        for n, a in shard.ring.columns.items():
            src = arrays[f"col_{n}"]
            if src.shape != a.shape or src.dtype != a.dtype:
                raise CheckpointError(
                    f"column {n!r}: checkpoint has {src.dtype}{src.shape}, table has {a.dtype}{a.shape}"
                )
            shard.tier.write_rows(a, 0, src)
        if arrays["active"].shape != (cap,):
            raise CheckpointError(f"shard capacity {cap} does not match the checkpoint's {arrays['active'].shape[0]}")
        shard.active[:] = arrays["active"]
        shard.priority[:] = arrays["priority"]
        if shard.step_episode is not None:
            shard.step_episode[:] = arrays["step_episode"]
        if shard.times_sampled is not None and "times_sampled" in arrays:
            shard.times_sampled[:] = arrays["times_sampled"]
        for role in ("sampler", "remover"):
            sel = getattr(shard, role)
            if getattr(sel, "tree", None) is not None:
                t = arrays.get(f"{role}_tree")
                if t is None or t.shape != sel.tree.shape:
                    raise CheckpointError(f"the checkpoint's {role} state does not match {sel!r}")
                sel.load_tree(t)
        if hasattr(shard.sampler, "epoch"):
            shard.sampler.epoch = meta.get("epoch", 0)
        idx = shard.index
        idx.first = idx.next = meta["episodes_first"]
        n_eps = meta["episodes_next"] - meta["episodes_first"]
        if n_eps:
            idx.append(*(arrays[f"episode_{f}"] for f in ("start", "length", "stamp", "episode_id")))
        shard.ring.write_pos = meta["write_pos"]
        shard.size = meta["size"]
        shard.max_priority = meta["max_priority"]
        shard.counters = Counters(**meta["counters"])
        if "touched" in arrays:
            shard.touched[:] = arrays["touched"]
        else:  # a checkpoint from before heap ties were stamped: insertion order
            live = np.flatnonzero(shard.active)
            shard.touched[live] = shard.item_stamps(live)
        shard._clock = int(shard.touched.max(initial=-1)) + 1
        shard.tails.clear()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def fsync_path(path: str | os.PathLike[str]) -> None:
    """``fsync`` a file or a directory by path (a directory: the names just created or renamed in it).

    Parameters
    ----------
    path : str or os.PathLike
        The file or directory.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_shard_file(
    directory: str | os.PathLike[str], shard_id: int, arrays: dict[str, np.ndarray]
) -> tuple[str, str]:
    """Write one shard's arrays as ``shard-<id>.npz`` (mode :func:`file_mode`, fsync'ed).

    Parameters
    ----------
    directory : str or os.PathLike
        The checkpoint's temporary directory (:func:`temp_dir`).
    shard_id : int
        The shard's id in the table; names the file.
    arrays : dict of str to numpy.ndarray
        Host arrays, as :func:`snapshot_shard` returned them.

    Returns
    -------
    name : str
        The file's name, relative to ``directory``.
    sha256 : str
        Hex SHA-256 of the file, for the manifest.
    """
    name = f"shard-{shard_id}.npz"
    path = Path(directory) / name
    with _create(path, file_mode()) as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    return name, _sha256(path)


def read_shard_file(directory: str | os.PathLike[str], name: str, sha256: str | None) -> dict[str, np.ndarray]:
    """Read one shard file back, after checking its checksum (no pickle).

    Parameters
    ----------
    directory : str or os.PathLike
        The checkpoint directory.
    name : str
        The file's name, as the manifest lists it.
    sha256 : str or None
        The checksum the manifest recorded (None: not checked).

    Returns
    -------
    dict of str to numpy.ndarray
        The shard's arrays, as written.

    Raises
    ------
    CheckpointError
        The file is missing, corrupted (checksum) or not a readable ``.npz``.
    """
    path = Path(directory) / name
    if not path.exists():
        raise CheckpointError(f"checkpoint file {path} is missing")
    if sha256 is not None and _sha256(path) != sha256:
        raise CheckpointError(f"checkpoint file {path} is corrupted (SHA-256 mismatch)")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as e:  # truncated or not an npz at all
        raise CheckpointError(f"checkpoint file {path} cannot be read: {e}") from None


def commit(tmp: Path, final: Path, manifest: dict[str, Any]) -> Path:
    """Write the manifest into ``tmp``, fsync, and atomically rename ``tmp`` to ``final``.

    An older checkpoint at ``final`` is moved aside first and removed once the
    new one is in place; anything else there is refused (:func:`check_replaceable`).

    Parameters
    ----------
    tmp : pathlib.Path
        The directory the shard files were written into (:func:`temp_dir`).
    final : pathlib.Path
        Where the checkpoint goes.
    manifest : dict
        JSON-able, from :func:`new_manifest`.

    Returns
    -------
    pathlib.Path
        ``final``.
    """
    mpath = tmp / "manifest.json"
    with _create(mpath, file_mode()) as f:
        f.write(json.dumps(manifest, indent=1).encode())
        f.flush()
        os.fsync(f.fileno())
    fsync_path(tmp)
    check_replaceable(final)  # (again: something may have been put there while the shards were written)
    try:
        if final.exists() and _exchange(tmp, final):  # the new one in place and the old one at tmp, in one step
            shutil.rmtree(tmp, ignore_errors=True)
        elif final.exists():  # (no exchange here) old -> aside, new -> final; a kill between: see _sweep
            trash = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:6]}")
            os.rename(final, trash)
            os.rename(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, final)
        fsync_path(final.parent)
    finally:
        _release(tmp)
    return final


def _exchange(a: Path, b: Path) -> bool:
    """Swap directories ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``); False where the system
    or file system cannot."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def make_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` and its missing parents with :func:`dir_mode` (they hold replay data: checkpoints, disk
    tables).

    Parameters
    ----------
    path : str or os.PathLike
        The directory.

    Returns
    -------
    pathlib.Path
        The directory, as an absolute path.
    """
    path = Path(path).absolute()
    mode = dir_mode()
    for p in [*reversed(path.parents), path]:
        if not p.exists():
            p.mkdir(mode=mode, exist_ok=True)
            os.chmod(p, mode)  # mkdir's mode is narrowed by the umask
    return path


def atomic_write(path: str | os.PathLike[str], text: str) -> None:
    """Replace file ``path`` by ``text`` atomically: a new file of :func:`file_mode`, fsync'ed, renamed over it,
    the directory fsync'ed.

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    text : str
        Its new contents.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with _create(tmp, file_mode()) as f:
        f.write(text.encode())
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fsync_path(path.parent)


def check_replaceable(final: str | os.PathLike[str]) -> None:
    """Refuse to write a checkpoint where something other than a checkpoint is: only nothing, or a checkpoint
    of a local or distributed table (which the new one replaces), may be at ``final``.

    Parameters
    ----------
    final : str or os.PathLike
        Where the checkpoint will go.

    Raises
    ------
    CheckpointError
        ``final`` is a file (or a link), a directory that is neither empty
        nor a gear_flow checkpoint (a user's files), or a disk table's own
        directory.
    """
    final = Path(final)
    if not final.exists() and not final.is_symlink():
        return
    if final.is_symlink() or not final.is_dir():
        what = "a link" if final.is_symlink() else "a file"
    elif not any(final.iterdir()):  # an empty directory made for it: nothing to lose
        return
    else:
        try:  # (any version of the format: an older checkpoint is replaced as well)
            m = json.loads((final / "manifest.json").read_text())
            kind = m.get("kind") if isinstance(m, dict) and m.get("format") == FORMAT else None
        except (OSError, ValueError):
            kind = None
        if kind in ("local", "distributed"):
            return
        what = "a disk table's directory" if kind == "disk" else "a directory that is not a gear_flow checkpoint"
    raise CheckpointError(f"{final} is {what}; a checkpoint replaces only an older checkpoint (nothing was written)")


def temp_dir(final: str | os.PathLike[str]) -> Path:
    """A new private directory beside ``final`` to write a checkpoint into, once :func:`check_replaceable`
    agrees that one may go there; held (``flock``) until :func:`commit` or :func:`discard`.

    What a checkpoint to ``final`` whose process ended mid-way left beside it is dealt with first
    (:func:`_sweep`): its directories, each as large as a checkpoint, stayed forever.

    Parameters
    ----------
    final : str or os.PathLike
        Where the checkpoint will go; missing parents are created with
        :func:`dir_mode`.

    Returns
    -------
    pathlib.Path
        ``.<name>.tmp-<random>`` beside ``final``, mode exactly :func:`dir_mode`.

    Raises
    ------
    CheckpointError
        Something other than a checkpoint is at ``final``.
    """
    final = Path(final)
    check_replaceable(final)
    mode = dir_mode()
    make_dir(final.parent)
    _sweep(final)
    token = uuid.uuid4().hex[:8]
    new, tmp = final.with_name(f".{final.name}.new-{token}"), final.with_name(f".{final.name}.tmp-{token}")
    new.mkdir(mode=mode)
    os.chmod(new, mode)  # mkdir's mode is narrowed by the umask only; make it exact
    fd = _hold(new)
    os.rename(new, tmp)  # held before it has a name a sweep takes (the lock goes with the directory)
    _HELD[str(tmp)] = fd
    return tmp


def discard(tmp: Path) -> None:
    """Remove a checkpoint's temporary directory (:func:`temp_dir`) that will not be committed, and let it go.

    Parameters
    ----------
    tmp : pathlib.Path
        The directory.
    """
    shutil.rmtree(tmp, ignore_errors=True)
    _release(tmp)


#: the temporary directories of the checkpoints this process is writing -> the descriptor that holds each
#: (``flock``): a checkpoint to the same path begun meanwhile, here or in another process of a machine that
#: shares the lock, leaves them alone
_HELD: dict[str, int] = {}


def _hold(d: Path) -> int | None:
    """A descriptor of directory ``d`` holding an exclusive ``flock`` on it; None where the file system has no
    such locks (the directory is then never taken for a dead writer's: see :func:`_sweep`)."""
    import fcntl

    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _release(d: Path) -> None:
    fd = _HELD.pop(str(d), None)
    if fd is not None:
        os.close(fd)


def _drop_inherited() -> None:
    """In a forked child: close its copies of the descriptors (a flock belongs to every copy, and a child that
    outlived a killed writer kept its directory from being swept)."""
    for fd in _HELD.values():
        if fd is not None:
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_drop_inherited)


def _sweep(final: Path) -> None:
    """Deal with what checkpoints to ``final`` whose processes ended mid-way left beside it.

    A temporary directory that no live writer holds is removed; one that holds a whole checkpoint (its
    manifest written) when nothing is at ``final`` was cut between its commit's two renames (where
    ``renameat2`` cannot exchange them) and is renamed into place, for it is the newest checkpoint.  An older
    checkpoint moved aside by such a commit is removed once ``final`` holds one.  A directory this process
    cannot lock (a live writer, or a file system without locks) is left alone.
    """
    for d in sorted(final.parent.glob(f".{final.name}.tmp-*")) + sorted(final.parent.glob(f".{final.name}.old-*")):
        if not d.is_dir() or d.is_symlink():
            continue
        fd = _hold(d)
        if fd is None:
            continue
        written_here = d.name.startswith(f".{final.name}.tmp-")  # (else moved aside by a commit)
        try:
            if written_here and (d / "manifest.json").exists() and not final.exists():
                os.rename(d, final)
                fsync_path(final.parent)
            elif written_here or final.exists():
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass  # (another process got to it first)
        finally:
            os.close(fd)


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's ``manifest.json``, after checking its format and version.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory.

    Returns
    -------
    dict
        The manifest, as :func:`new_manifest` made it.

    Raises
    ------
    CheckpointError
        No manifest, not JSON, or another format or version.
    """
    mpath = Path(path) / "manifest.json"
    if not mpath.exists() and not Path(path).exists():
        _sweep(Path(path).absolute())  # (a checkpoint killed between its commit's renames: put in place)
    if not mpath.exists():
        raise CheckpointError(f"{path} is not a gear_flow checkpoint (no manifest.json)")
    try:
        m = json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{mpath} is corrupted: {e}") from None
    if m.get("format") != FORMAT or m.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: format {m.get('format')!r} version {m.get('version')!r}; this gear_flow reads {FORMAT!r} version {VERSION}"
        )
    return m


def new_manifest(
    kind: str, table_config: dict[str, Any], state: dict[str, Any], files: dict[str, Any]
) -> dict[str, Any]:
    """A manifest for :func:`commit`, stamped with :data:`FORMAT`, :data:`VERSION` and the time.

    Parameters
    ----------
    kind : str
        ``"local"`` or ``"distributed"``: the kind of table checkpointed.
    table_config : dict
        The table's configuration (spec, selectors, limiter), JSON-able.
    state : dict
        Table-wide state: limiter counts, counters.
    files : dict
        Per shard id (a string), ``{"file", "sha256", "meta"}``: its file
        name, checksum and :func:`snapshot_shard` metadata.

    Returns
    -------
    dict
        ``format``, ``version``, ``kind``, ``created`` (local time,
        ISO 8601), ``table``, ``state`` and ``files``.
    """
    return {
        "format": FORMAT,
        "version": VERSION,
        "kind": kind,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "table": table_config,
        "state": state,
        "files": files,
    }
