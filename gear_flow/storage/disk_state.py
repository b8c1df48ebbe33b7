"""A disk shard's own checkpoint: its layout, a header committed after every change, flushes and recovery.

A disk shard's directory holds, beside its mapped arrays
(:mod:`gear_flow.storage.disk`)::

    layout.json     format, version, the table's configuration, the shard's id and
                    every array's file, dtype and shape; its own SHA-256 inside
    header.bin      two slots of the shard's scalars (write position, episode
                    index bounds, counters, ...), each with a CRC32, and which
                    one is current
    checksums.json  CRC32 of every MiB of every array, as of the last flush

**Commits.**  Every change of the shard (an insert, a priority update, a
delete, a removal) runs inside :meth:`DiskStore.writing`; at its end the
shard's scalars go into the header slot that is not current, and only then
does the header name that slot current (an aligned 8-byte store).  A process
killed at any point leaves a header that names a whole slot.  An insert also
commits *before* it changes anything: ``writing_until`` (the end of the
steps it is about to write) and ``episodes_until``.  Reopening a header whose
``writing_until`` is past ``write_pos`` finds an insert cut short: its steps
and episodes are dropped, and so are the episodes whose steps it was
overwriting (the ring no longer holds them whole); every insert that
completed is there.  Trees are rebuilt from their leaves and the size counted
from the items' state on every reopen, so a change cut short elsewhere
leaves no inconsistent tree behind.

**Durability.**  The files live in the page cache, which outlives the
process: a killed process loses nothing that was committed.  Surviving the
machine (power loss) needs :meth:`DiskStore.flush`: it writes the dirty
pages (``msync``), records the checksums of what changed since the last
flush, commits the header as *clean* and fsyncs it.  That is the same
promise a checkpoint makes (checksummed, no pickle), without a copy: a disk
table is its own checkpoint.

**Verification.**  Opening checks the layout's SHA-256, the header's CRC,
the format version and every file's size, before anything is mapped; a
mismatch raises :class:`~gear_flow.errors.CheckpointError` and nothing is
opened.  ``verify="full"`` also recomputes the checksum of every MiB that has
not changed since the last flush (the data's bytes, so its time is a read of
the table).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checkpoint import atomic_write, file_mode, fsync_path
from ..errors import CheckpointError
from .disk import DiskTier

if TYPE_CHECKING:
    from ..shard import Shard

FORMAT = "gear-flow-disk"
VERSION = 1
MAGIC = b"GFDISK01"
#: bytes per checksum
CHUNK = 1 << 20
#: the header's scalars, in their order in a slot (int64 each); then ``max_priority`` (float64), the counters
SCALARS = (
    "seq",  # commits so far
    "clean",  # 1: committed by a flush, nothing changed since (the state's checksums hold)
    "write_pos",
    "writing_until",  # > write_pos: an insert was writing these steps
    "episodes_until",  # > index_next: ... and these episodes
    "index_first",
    "index_next",
    "index_size",
    "size",
    "clock",
    "episode_id_end",  # one past the largest episode id this shard has stored
    "crc_pos",  # write position at the last flush: ring positions before it have checksums
    "sampler_epoch",
    "remover_epoch",
)
#: where the current slot's number is, and where the slots start
_SLOT_SIZE, _SLOTS_AT = 512, 64
#: the episode index's rows in its file
INDEX_FIELDS = ("start", "length", "stamp", "episode_id")


def _counter_fields() -> tuple[str, ...]:
    from ..shard import Counters

    return tuple(f.name for f in dataclasses.fields(Counters))


def _slot_struct() -> struct.Struct:
    return struct.Struct(f"<8sq{len(SCALARS)}qd{len(_counter_fields())}q")


def _canonical(d: dict[str, Any]) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def table_config(shard: Shard, cfg: dict[str, Any] | None) -> dict[str, Any]:
    """The configuration a layout records: the table's (``cfg``) or, without one, the shard's spec and selectors.

    Parameters
    ----------
    shard : Shard
        The shard.
    cfg : dict, optional
        :meth:`~gear_flow.table.config.TableConfig.to_dict` of its table.

    Returns
    -------
    dict
        JSON-able.
    """
    if cfg is not None:
        return dict(cfg)
    from ..selectors import to_config

    return {
        "spec": shard.spec.to_dict(),
        "sampler": to_config(shard.sampler),
        "remover": to_config(shard.remover),
        "max_times_sampled": shard.max_times_sampled,
    }


def read_layout(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """A disk shard's ``layout.json``, verified (format, version, its SHA-256).

    Parameters
    ----------
    directory : str or os.PathLike
        The shard's directory.

    Returns
    -------
    dict
        The layout: ``format``, ``version``, ``shard``, ``table`` (its
        configuration), ``arrays`` (name to ``{"dtype", "shape"}``),
        ``columns`` (column name to array name), ``trees`` (role to array name).

    Raises
    ------
    CheckpointError
        No layout, not JSON, its checksum fails, or another format or version.
    """
    path = Path(directory) / "layout.json"
    if not path.exists():
        raise CheckpointError(f"{directory} is not a gear_flow disk shard (no layout.json)")
    try:
        d = json.loads(path.read_bytes())
        digest = d.pop("sha256")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError, TypeError) as e:
        raise CheckpointError(f"{path} is corrupted: {e}") from None
    if hashlib.sha256(_canonical(d)).hexdigest() != digest:
        raise CheckpointError(f"{path} is corrupted (SHA-256 mismatch)")
    if d.get("format") != FORMAT or d.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: format {d.get('format')!r} version {d.get('version')!r}; this gear_flow reads {FORMAT!r} "
            f"version {VERSION}"
        )
    return d


def read_header(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The current slot of a disk shard's ``header.bin``, verified (magic, version, CRC32).

    Parameters
    ----------
    directory : str or os.PathLike
        The shard's directory.

    Returns
    -------
    dict
        Every name of :data:`SCALARS`, ``max_priority`` and ``counters`` (a dict).

    Raises
    ------
    CheckpointError
        No header, or its current slot fails verification.
    """
    path = Path(directory) / "header.bin"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{directory} is not a gear_flow disk shard (no header.bin)") from None
    st = _slot_struct()
    if len(raw) != _SLOTS_AT + 2 * _SLOT_SIZE:
        raise CheckpointError(f"{path} is corrupted (it has {len(raw)} bytes)")
    cur = int.from_bytes(raw[:8], "little")
    if cur not in (0, 1):
        raise CheckpointError(f"{path} is corrupted (its current slot is {cur})")
    at = _SLOTS_AT + cur * _SLOT_SIZE
    body = raw[at : at + st.size]
    crc = int.from_bytes(raw[at + st.size : at + st.size + 4], "little")
    if zlib.crc32(body) != crc:
        raise CheckpointError(f"{path} is corrupted (CRC32 mismatch)")
    values = st.unpack(body)
    if values[0] != MAGIC or values[1] != VERSION:
        raise CheckpointError(f"{path}: not a version {VERSION} gear_flow disk header")
    n = len(SCALARS)
    h = dict(zip(SCALARS, values[2 : 2 + n]))
    h["max_priority"] = values[2 + n]
    h["counters"] = dict(zip(_counter_fields(), values[3 + n :]))
    return h


def check(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Everything about a disk shard that can be checked without mapping it: layout, header, file sizes.

    Parameters
    ----------
    directory : str or os.PathLike
        The shard's directory.

    Returns
    -------
    layout : dict
        As :func:`read_layout` gives it.
    header : dict
        As :func:`read_header` gives it.

    Raises
    ------
    CheckpointError
        Any check fails (named).
    """
    layout = read_layout(directory)
    header = read_header(directory)
    for name, want in _file_sizes(layout, header).items():
        path = Path(directory) / f"{name}.bin"
        try:
            have = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"disk shard {directory}: file {path.name} is missing") from None
        if have != want:
            raise CheckpointError(
                f"disk shard {directory}: file {path.name} has {have} bytes, its layout says {want} "
                "(truncated or from another table)"
            )
    return layout, header


def _file_sizes(layout: dict[str, Any], header: dict[str, Any]) -> dict[str, int]:
    """The bytes of every array file of a shard, the layout's and the episode index of the header's size (at
    least 1: an empty array's file too)."""
    arrays = {n: (a["dtype"], tuple(a["shape"])) for n, a in layout["arrays"].items()}
    arrays[f"index-{header['index_size']}"] = ("<i8", (len(INDEX_FIELDS), int(header["index_size"])))
    return {n: max(1, int(np.prod(shape)) * np.dtype(dt).itemsize) for n, (dt, shape) in arrays.items()}


def verify_files(directory: str | os.PathLike[str], layout: dict[str, Any], header: dict[str, Any]) -> dict[str, int]:
    """:func:`verify` of a shard's files as :func:`check` read them, before anything maps or changes them
    (``LocalTable.open(verify="full")``: a refused open leaves every file as it was).

    Parameters
    ----------
    directory : str or os.PathLike
        The shard's directory.
    layout, header : dict
        As :func:`check` returns them.

    Returns
    -------
    dict
        ``bytes_verified``.

    Raises
    ------
    CheckpointError
        A chunk's checksum differs, or the checksums do not describe the files.
    """
    nbytes = _file_sizes(layout, header)
    try:
        capacity = int(layout["table"]["spec"]["capacity"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"disk shard {directory}: its layout names no capacity") from None
    return verify(directory, nbytes, capacity, header)


def verify(
    directory: str | os.PathLike[str], nbytes: dict[str, int], capacity: int, h: dict[str, Any]
) -> dict[str, int]:
    """Recompute the checksums of every MiB of a shard's files that has not changed since the last flush.

    A ring's chunks written up to the last flush, less those written since; every other array's, when
    the header is clean (unchanged since the flush: an array changed in place has no checksums that apply).

    Parameters
    ----------
    directory : str or os.PathLike
        The shard's directory (its ``checksums.json`` and array files).
    nbytes : dict of str to int
        Each array's name and size in bytes.
    capacity : int
        The shard's ring positions.
    h : dict
        The header that says what changed since the flush.

    Returns
    -------
    dict
        ``bytes_verified``.

    Raises
    ------
    CheckpointError
        A chunk's checksum differs (its array and byte range named), or ``checksums.json`` is not a
        list of one checksum per MiB of each array it names.
    """
    path = Path(directory) / "checksums.json"
    try:
        sums = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {"bytes_verified": 0}
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is corrupted: {e}") from None
    bad = not isinstance(sums, dict) or any(
        n in nbytes and (not isinstance(v, list) or len(v) != _chunks(nbytes[n])) for n, v in sums.items()
    )
    if bad:
        raise CheckpointError(f"{path} is corrupted: not one checksum per MiB of each array it names")
    done = 0
    for name, size in nbytes.items():
        if name not in sums:
            continue
        if name.startswith("ring-"):  # what was written up to the last flush, less what changed since
            skip = _ring_chunks(size, capacity, int(h["crc_pos"]), int(h["writing_until"]))
            written = _ring_chunks(size, capacity, 0, int(h["crc_pos"]))
            if skip is None:
                continue
            which = np.setdiff1d(np.arange(len(sums[name])) if written is None else written, skip)
        elif h["clean"]:
            which = np.arange(len(sums[name]))
        else:  # changed since the flush, in place: its checksums no longer apply
            continue
        for c, v in _crc_chunks(Path(directory) / f"{name}.bin", size, which).items():
            if sums[name][c] != v:
                raise CheckpointError(
                    f"disk shard {directory}: {name}.bin is corrupted at bytes "
                    f"[{c * CHUNK}, {min(size, (c + 1) * CHUNK)}) (CRC32 mismatch)"
                )
            done += min(CHUNK, size - c * CHUNK)
    return {"bytes_verified": done}


def _ring_chunks(nbytes: int, capacity: int, lo: int, hi: int) -> np.ndarray | None:
    """Chunks of a ring array of ``nbytes`` holding positions ``[lo, hi)`` (None: all)."""
    if hi - lo >= capacity:
        return None
    if hi <= lo:
        return np.zeros(0, dtype=np.int64)
    nb = nbytes // capacity
    s, e = lo % capacity, (lo % capacity) + (hi - lo)
    spans = [(s, min(e, capacity))] + ([(0, e - capacity)] if e > capacity else [])
    out = [np.arange((a0 * nb) // CHUNK, -(-(b0 * nb) // CHUNK)) for a0, b0 in spans]
    return np.unique(np.concatenate(out))


def _chunks(nbytes: int) -> int:
    return max(1, -(-nbytes // CHUNK))


def _zero_crcs(nbytes: int) -> list[int]:
    """Checksums of ``nbytes`` zero bytes, chunk by chunk (a new, sparse file's)."""
    n = _chunks(nbytes)
    full = zlib.crc32(bytes(CHUNK))
    last = nbytes - (n - 1) * CHUNK
    return [full] * (n - 1) + [zlib.crc32(bytes(last)) if last != CHUNK else full]


def _crc_chunks(path: Path, nbytes: int, which: np.ndarray | None = None) -> dict[int, int]:
    """CRC32 of the MiB chunks ``which`` (default all) of the first ``nbytes`` of file ``path``.

    Read with ``pread`` in increasing order, not through the shard's mapping: the rings' mappings are advised
    random-access, and reading 38 GB through them faulted 4 KiB at a time (62 MB/s, a flush of 504 s); a file read
    in order gets the kernel's readahead, and cached pages are read from the cache either way.
    """
    idx = range(_chunks(nbytes)) if which is None else sorted(int(c) for c in which)
    out = {}
    buf = memoryview(bytearray(CHUNK))
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        for c in idx:
            want = max(0, min(CHUNK, nbytes - c * CHUNK))
            got = os.preadv(fd, [buf[:want]], c * CHUNK) if want else 0
            out[c] = zlib.crc32(buf[:got])
    finally:
        os.close(fd)
    return out


class DiskStore:
    """The persistence of one disk shard: built by the shard once its arrays are mapped (see the module docstring).

    A new shard writes its layout and first header; an existing one (the
    tier opens it) takes its state from the files and recovers from a cut
    insert.

    Parameters
    ----------
    shard : Shard
        The shard, its rings and per-item state already mapped by its :class:`DiskTier`.
    cfg : dict, optional
        The table's configuration, recorded in the layout (default: the shard's spec and selectors).

    Attributes
    ----------
    recovered : dict
        What reopening repaired: ``torn_steps`` and ``torn_episodes`` (an
        insert cut short, dropped), ``evicted`` (items of the episodes it was
        overwriting), ``clean`` (whether the last commit was a flush); empty for a new shard.
    """

    def __init__(self, shard: Shard, cfg: dict[str, Any] | None = None) -> None:
        self.shard = shard
        tier: DiskTier = shard.tier
        self.tier = tier
        self.directory = tier.directory
        self._depth = 0
        self._stale_index: list[str] = []
        self.recovered: dict[str, Any] = {}
        self.columns = {c: f"ring-{k}" for k, c in enumerate(shard.ring.columns)}
        self.trees = {}
        for role in ("sampler", "remover"):
            t = self._tree(getattr(shard, role))
            if t is not None and all(t is not self._tree(getattr(shard, r)) for r in self.trees):
                self.trees[role] = t
        for role, t in self.trees.items():
            t.place(tier.state(f"{role}-tree", t.tree.shape, np.float64), copy=tier.create)
        fd = os.open(self.directory / "header.bin", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.fchmod(fd, file_mode())
            os.ftruncate(fd, _SLOTS_AT + 2 * _SLOT_SIZE)
            import mmap

            self._hmap = mmap.mmap(fd, _SLOTS_AT + 2 * _SLOT_SIZE, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self._cur = np.frombuffer(self._hmap, dtype=np.int64, count=1)
        self._struct = _slot_struct()
        if tier.create:
            idx = shard.index
            self._index_name = f"index-{idx.size}"
            idx.share(INDEX_FIELDS, self._index_block)
            self.h = {k: 0 for k in SCALARS}
            self.h["index_size"] = idx.size
            self._capture()
            self.h["clean"] = 0
            self._write(self.h)
            self._write_layout(cfg)
        else:
            self.h = read_header(self.directory)
            self._reopen()

    @staticmethod
    def _tree(sel):
        return getattr(sel, "sums", None) or getattr(sel, "maxes", None)

    def _index_block(self, k: int, n: int) -> np.ndarray:
        name = f"index-{n}"
        if self._index_name != name:  # the index grows: the old file goes once a header names the new one
            self._stale_index.append(self._index_name)
            self._index_name = name
        return self.tier.array(name, (k, n), np.int64, new=True)

    def _write_layout(self, cfg: dict[str, Any] | None) -> None:
        arrays = {}
        for name, a in self.tier.arrays.items():
            if not name.startswith("index-"):
                arrays[name] = {"dtype": a.dtype.str, "shape": list(a.shape)}
        d = {
            "format": FORMAT,
            "version": VERSION,
            "shard": self.shard.shard_id,
            "table": table_config(self.shard, cfg),
            "arrays": arrays,
            "columns": self.columns,
            "trees": {role: f"{role}-tree" for role in self.trees},
        }
        d["sha256"] = hashlib.sha256(_canonical(d)).hexdigest()
        atomic_write(self.directory / "layout.json", json.dumps(d, indent=1))

    # -- commits -------------------------------------------------------------------------------
    def _capture(self) -> None:
        """Take the shard's scalars into :attr:`h` (as they are now)."""
        s, h = self.shard, self.h
        idx = s.index
        h["write_pos"] = h["writing_until"] = s.ring.write_pos
        h["index_first"], h["index_next"], h["index_size"] = idx.first, idx.next, idx.size
        h["episodes_until"] = idx.next
        h["size"] = s.size
        h["clock"] = s._clock
        h["episode_id_end"] = max(h["episode_id_end"], s.episode_id_end())
        h["sampler_epoch"] = int(getattr(s.sampler, "epoch", 0))
        h["remover_epoch"] = int(getattr(s.remover, "epoch", 0))
        h["max_priority"] = float(s.max_priority)
        h["counters"] = s.counters.as_dict()

    def _write(self, h: dict[str, Any]) -> None:
        """Commit ``h``: into the slot that is not current, then name it current."""
        h["seq"] = int(h.get("seq", 0)) + 1
        counters = h.get("counters") or dict.fromkeys(_counter_fields(), 0)
        body = self._struct.pack(
            MAGIC,
            VERSION,
            *(int(h[k]) for k in SCALARS),
            float(h.get("max_priority", 1.0)),
            *(int(counters[k]) for k in _counter_fields()),
        )
        nxt = 1 - int(self._cur[0])
        at = _SLOTS_AT + nxt * _SLOT_SIZE
        self._hmap[at : at + len(body)] = body
        self._hmap[at + len(body) : at + len(body) + 4] = zlib.crc32(body).to_bytes(4, "little")
        self._cur[0] = nxt  # the commit point: one aligned store

    def begin_insert(self, writing_until: int, episodes_until: int, episode_id_end: int) -> None:
        """Commit that an insert is about to write steps up to ``writing_until`` and episodes up to ``episodes_until``.

        Called by the shard under its lock, inside :meth:`writing`, before any
        slot or record changes.

        Parameters
        ----------
        writing_until : int
            Absolute position one past its last step.
        episodes_until : int
            Sequence number one past its last episode.
        episode_id_end : int
            One past its largest episode id (ids handed out are never handed out again, even by a cut insert).
        """
        self.h["writing_until"] = int(writing_until)
        self.h["episodes_until"] = int(episodes_until)
        self.h["episode_id_end"] = max(int(self.h["episode_id_end"]), int(episode_id_end))
        self.h["clean"] = 0
        self._write(self.h)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """The block in which the shard changes; its outermost end commits the header.

        Yields
        ------
        None
            Nested blocks count as one.
        """
        if self._depth == 0 and self.h["clean"]:
            self.h["clean"] = 0
            self._write(self.h)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.commit()

    def commit(self, clean: bool = False) -> None:
        """Commit the shard's scalars as they are now (call under its lock).

        Parameters
        ----------
        clean : bool, default False
            Mark the state as flushed (only :meth:`flush`).
        """
        self._capture()
        self.h["clean"] = int(clean)
        self._write(self.h)
        for name in self._stale_index:
            self.tier.discard(name)
        self._stale_index.clear()

    # -- flush and checksums ---------------------------------------------------------------------
    def _dirty_ring_chunks(self, name: str, lo: int, hi: int) -> np.ndarray | None:
        """Chunks of ring array ``name`` holding positions ``[lo, hi)`` (None: all)."""
        return _ring_chunks(self.tier.arrays[name].nbytes, self.shard.capacity, lo, hi)

    def flush(self) -> dict[str, int]:
        """Make the shard durable: dirty pages written, checksums of what changed, the header clean and fsync'ed.

        Call under the shard's lock.

        Returns
        -------
        dict
            ``bytes_checksummed``: bytes whose checksums were computed.
        """
        tier, h = self.tier, self.h
        tier.sync()
        path = self.directory / "checksums.json"
        try:
            sums = json.loads(path.read_bytes())
        except (FileNotFoundError, json.JSONDecodeError):
            sums = {}
        done = 0
        for name, a in tier.arrays.items():
            if name.startswith("ring-"):
                # a ring file is made sparse, all zeros: only what was written since the last flush is read (reading
                # a hole of a shared mapping would fill the page cache with zero pages, gigabytes of them)
                if name not in sums or len(sums[name]) != _chunks(a.nbytes):
                    sums[name] = _zero_crcs(a.nbytes)
                which = self._dirty_ring_chunks(name, int(h["crc_pos"]), self.shard.ring.write_pos)
            else:
                which = None
            new = _crc_chunks(tier.path_of(name), a.nbytes, which)
            done += sum(min(CHUNK, a.nbytes - c * CHUNK) for c in new)
            if len(sums.get(name, ())) != _chunks(a.nbytes):  # an array new since the last flush: every chunk is new
                sums[name] = [0] * _chunks(a.nbytes)
            for c, v in new.items():
                sums[name][c] = v
        sums = {n: v for n, v in sums.items() if n in tier.arrays}
        atomic_write(path, json.dumps(sums))
        self._capture()
        h["crc_pos"] = self.shard.ring.write_pos
        h["clean"] = 1
        self._write(h)
        self._hmap.flush()
        fsync_path(self.directory)
        return {"bytes_checksummed": done}

    # -- reopening ------------------------------------------------------------------------------
    def _reopen(self) -> None:
        s, h, tier = self.shard, self.h, self.tier
        idx = s.index
        self._index_name = f"index-{h['index_size']}"
        block = tier.array(self._index_name, (len(INDEX_FIELDS), int(h["index_size"])), np.int64, new=False)
        idx.adopt(INDEX_FIELDS, block, int(h["index_first"]), int(h["index_next"]), self._index_block)
        s.ring.write_pos = int(h["write_pos"])
        s._clock = int(h["clock"])
        s.max_priority = float(h["max_priority"])
        from ..shard import Counters

        s.counters = Counters(**h["counters"])
        for role in ("sampler", "remover"):
            sel = getattr(s, role)
            if hasattr(sel, "epoch"):
                sel.epoch = int(h[f"{role}_epoch"])
        torn_steps = int(h["writing_until"]) - int(h["write_pos"])
        torn_eps = int(h["episodes_until"]) - int(h["index_next"])
        evicted = 0
        s.size = int(h["size"])  # what the repair's evictions count down from; counted from the items below
        if torn_steps > 0 or torn_eps > 0:
            evicted = self._repair(int(h["write_pos"]), int(h["writing_until"]), int(h["index_next"]), torn_eps)
        if torn_steps > 0:
            self._checksum_torn(int(h["write_pos"]), int(h["writing_until"]))
        gone = s.active == 0
        for t in self.trees.values():
            # a removal cut short (a delete's, an expiry's) may have deactivated items before emptying their
            # leaves: no weight stays on an item that is not there (a draw would hand a deleted item out)
            t.leaves[gone] = t._empty
            t.rebuild()
        s.size = int(np.count_nonzero(s.active))
        cut = int(h["size"]) - s.size
        if torn_steps <= 0 and torn_eps <= 0 and cut > 0:
            # ... and before its commit counted them: they are gone, counted as deleted (the limiter's deletes
            # follow the shard's, see LocalTable.open), so that every item inserted is counted once somewhere
            s.counters.deleted += cut
        for stray in self.directory.glob("index-*.bin"):  # an index grown by an insert that was cut short
            if stray.stem != self._index_name:
                stray.unlink()
        self.recovered = {
            "torn_steps": max(0, torn_steps),
            "torn_episodes": max(0, torn_eps),
            "evicted": evicted,
            "clean": bool(h["clean"]),
        }
        self.commit()

    def _checksum_torn(self, w: int, until: int) -> None:
        """The checksums of the ring chunks an insert cut short wrote (positions ``[w, until)``), recomputed.

        The reopen's commit forgets that those positions changed (its header's ``writing_until`` is its
        ``write_pos``), so a flush before later inserts wrote them again kept the old checksums, and an
        ``open(verify="full")`` of a table closed cleanly since refused it as corrupted.  The bytes are
        synced first, as a flush's are.
        """
        path = self.directory / "checksums.json"
        try:
            sums = json.loads(path.read_bytes())
        except (FileNotFoundError, json.JSONDecodeError):
            return  # (no checksums yet, or none that a verify would take: the next flush writes them)
        names = [n for n in self.columns.values() if n in sums]
        self.tier.sync(names)
        for name in names:
            a = self.tier.arrays[name]
            which = self._dirty_ring_chunks(name, w, until)
            if len(sums[name]) == _chunks(a.nbytes):
                for c, v in _crc_chunks(self.tier.path_of(name), a.nbytes, which).items():
                    sums[name][c] = v
        atomic_write(path, json.dumps(sums))

    def _repair(self, w: int, until: int, next_seq: int, n_eps: int) -> int:
        """Drop an insert cut short: the episodes it was overwriting, its steps' items, its episodes' items."""
        s = self.shard
        committed = s.counters.evicted
        s._evict_steps_before(until - s.capacity)  # their steps were being overwritten
        if s.step_items:
            from .base import ring_slots

            slots = ring_slots(w, until - w, s.capacity)
            s.step_episode[slots] = -1
        else:
            slots = np.arange(next_seq, next_seq + n_eps, dtype=np.int64) % s.capacity
        s.active[slots] = 0
        for t in self.trees.values():  # their leaves may hold the cut insert's weights
            t.leaves[slots] = t._empty
        # the cut insert may have dropped some of those episodes' items already (its first step), uncounted:
        # what the last commit held, less what is left, is what it evicted
        evicted = int(self.h["size"]) - int(np.count_nonzero(s.active))
        s.counters.evicted = committed + evicted
        return evicted

    # -- accounting ------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """Bytes on disk and resident, and the directory.

        Returns
        -------
        dict
            ``path`` (str), ``bytes_on_disk`` (int), ``bytes_resident``
            (int or None: what the page cache holds of its files),
            ``page_in_bytes`` (int or None: read from storage by this
            process so far, all of its files), ``clean`` (bool: nothing
            changed since the last flush).
        """
        from .disk import page_in_bytes

        return {
            "path": str(self.directory),
            "bytes_on_disk": self.tier.bytes_on_disk(),
            "bytes_resident": self.tier.bytes_resident(),
            "page_in_bytes": page_in_bytes(),
            "clean": bool(self.h["clean"]),
        }

    def close(self) -> None:
        """Flush, and forget the mappings (the files stay: :meth:`LocalTable.open` reopens them)."""
        self.flush()
        self.tier.release()
