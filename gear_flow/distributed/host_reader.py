"""A worker drawing for every shard of its host from their published selection state: one request per host.

A reader on another host cannot map a host's segments, so without this it
sends each worker of that host its own draw request.  Instead it sends one
``draw_host`` request to one worker of the host, naming every worker's part
(its shards' counts and first-level shares, the seed that worker would draw
with) and the layouts those workers published; this worker maps their
segments (once: kept by segment name), draws each part by its owner's rule
and seed, in its owner's order
(:meth:`~gear_flow.storage.shared_selection.MappedState.draw`, as a reader on
the host does, :mod:`~gear_flow.distributed.reader_draw`), gathers the windows
into its reply and checks each state's version afterwards.  A part it cannot
draw that way (an owner writing, moving or gone, a tail mass not published)
is named in the reply's ``fallback`` and its owner draws it.

The layouts come from the reader, so they are checked as any input is: a
segment must be named as this host's gear_flow segments are, mapped
read-only, of a shape and dtype its layout states.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import GearFlowError, ProtocolError
from ..ops.gather import gather_windows
from ..ops.seeds import generator
from ..storage.shared import PREFIX, Attached, machine_id

if TYPE_CHECKING:
    from ..spec import TableSpec

#: draws of one part made again after its owner wrote during them, before the owner draws it
ATTEMPTS = 4
#: shards' mappings kept (by their header segment's name)
KEEP = 1024
_SEGMENT = re.compile(rf"^{PREFIX}\d+_[A-Za-z]*[0-9a-f]{{16}}$")
_DTYPES = {"|u1", "<i8", "<f8", "<f4", "<i4", "|b1", "<i2", "<u2", "<u4", "<u8", "|i1", "<f2"}


def _check_descriptor(d: Any, where: str) -> None:
    if not (isinstance(d, Mapping) and isinstance(d.get("segment"), str) and _SEGMENT.match(d["segment"])):
        raise ProtocolError(f"{where}: not a gear_flow segment of this host")
    shape = d.get("shape")
    if not (isinstance(shape, (list, tuple)) and all(isinstance(x, int) and 0 <= x < 1 << 40 for x in shape)):
        raise ProtocolError(f"{where}: bad shape")
    if d.get("dtype") not in _DTYPES:
        raise ProtocolError(f"{where}: bad dtype")


def check_layout(lay: Any, shard: int, columns: Sequence[str]) -> None:
    """Refuse a shard layout that is not one gear_flow publishes (one line, nothing mapped).

    Parameters
    ----------
    lay : object
        What the request names as shard ``shard``'s layout.
    shard : int
        The shard.
    columns : sequence of str
        The columns the request gathers.

    Raises
    ------
    ProtocolError
        Anything but a shard layout with its selection state, these columns and this host's segments.
    """
    where = f"worker 'draw_host': shard {shard}'s layout"
    if not (isinstance(lay, Mapping) and isinstance(lay.get("capacity"), int) and 0 < lay["capacity"] < 1 << 40):
        raise ProtocolError(f"{where}: not a shard layout")
    cols = lay.get("columns")
    if not isinstance(cols, Mapping) or any(c not in cols for c in columns):
        raise ProtocolError(f"{where}: lacks a requested column")
    sel = lay.get("selection")
    if not isinstance(sel, Mapping) or not isinstance(sel.get("layout"), Mapping):
        raise ProtocolError(f"{where}: publishes no selection state")
    for name, d in [("header", lay.get("header")), ("block", sel.get("block")), ("index", sel.get("index"))] + [
        (f"column {c}", cols[c]) for c in columns
    ]:
        _check_descriptor(d, f"{where} ({name})")
    for name, v in sel["layout"].items():
        if not (isinstance(v, (list, tuple)) and len(v) == 3 and isinstance(v[0], int) and v[0] >= 0):
            raise ProtocolError(f"{where}: bad place of {name!r}")
        if v[1] not in _DTYPES or not all(isinstance(x, int) and 0 <= x < 1 << 40 for x in v[2]):
            raise ProtocolError(f"{where}: bad place of {name!r}")


class HostReader:
    """This worker's mappings of its host's shards, and the draws it makes from them for a reader elsewhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: OrderedDict[str, Attached] = OrderedDict()

    def mapping(self, lay: dict, shard: int) -> Attached:
        """The mapping of shard ``shard`` published as ``lay`` (kept by its header segment's name).

        Parameters
        ----------
        lay : dict
            Its layout, checked (:func:`check_layout`).
        shard : int
            The shard.

        Returns
        -------
        Attached
            Its rings and selection state, mapped read-only.
        """
        key = lay["header"]["segment"]
        with self._lock:
            sh = self._maps.get(key)
            if sh is not None and not sh.selection.regrown():
                self._maps.move_to_end(key)
                return sh
        sh = Attached(lay, shard)
        with self._lock:
            self._maps[key] = sh
            while len(self._maps) > KEEP:
                self._maps.popitem(last=False)
        return sh

    def draw(
        self, spec: TableSpec, length: int, boundary: str, columns: Sequence[str], parts: Mapping[str, dict]
    ) -> dict:
        """Draw every worker's part of ``parts``, in order, each with its own seed.

        Parameters
        ----------
        spec : TableSpec
            The table's spec.
        length : int
            Window length.
        boundary : str
            Boundary mode.
        columns : sequence of str
            Columns gathered.
        parts : mapping of str to dict
            Per worker, ``layout`` (its ``shared_layout``), ``counts`` and
            ``scale`` (per shard), ``seed``.

        Returns
        -------
        dict
            Per shard drawn, the part as ``sample_part`` answers it (with
            ``data``, ``mass``, and ``drawn_here``); ``fallback``: the shards
            their owners must draw, every shard of a worker one of whose
            shards could not be drawn here (its owner draws the worker's
            part with its seed, as it would have drawn it).
        """
        here = machine_id()
        out: dict[Any, Any] = {}
        fallback: list[int] = []
        for part in parts.values():
            lay, counts, scale = part["layout"], part["counts"], part["scale"]
            if not (isinstance(lay, Mapping) and isinstance(lay.get("shards"), Mapping)):
                raise ProtocolError("worker 'draw_host': a part's layout is not a worker's shared_layout")
            rng = generator(part["seed"])
            drawn = {}
            for s in sorted(counts):  # the worker's part whole or not at all: its owner draws it with the seed
                shard_lay = lay["shards"].get(s, lay["shards"].get(str(s)))
                if lay.get("machine") != here or shard_lay is None:
                    break
                check_layout(shard_lay, s, columns)
                try:
                    sh = self.mapping(shard_lay, s)
                except (GearFlowError, OSError, ValueError):  # gone, or not this host's after all
                    break
                r = _draw_part(sh, spec, int(counts[s]), length, boundary, rng, columns) if sh.owner_alive() else None
                if r is None:
                    break
                r["p"] = r["p"] * float(scale[s])
                drawn[s] = r
            else:
                out.update(drawn)
                continue
            fallback.extend(sorted(counts))
        if fallback:
            out["fallback"] = fallback
        return out


def _draw_part(
    sh: Attached, spec: TableSpec, n: int, L: int, boundary: str, rng: np.random.Generator, columns: Sequence[str]
) -> dict | None:
    """One shard's part drawn from its published state and gathered into new buffers (None: its owner's)."""
    sel = sh.selection
    for _ in range(ATTEMPTS):
        d = sel.draw(n, L, boundary, rng, sh.capacity, spec.item_unit == "step")
        if d is None:
            return None
        w = d.windows
        src = w.src_abs % sh.capacity
        data = {}
        for c in columns:
            data[c] = np.empty((n, L, max(spec.column(c).nbytes, 1)), np.uint8)
            gather_windows(sh.bytes[c], src, w.dst_offset, w.n_valid, data[c])
        if sel.unchanged(d.version):
            return {"seqs": w.seqs, "p": d.probs, "episode_ids": w.episode_ids, "timesteps": w.timesteps,
                    "dst_offset": w.dst_offset, "n_valid": w.n_valid, "expired": 0, "priorities": d.priorities,
                    "times_sampled": None, "mass": d.mass, "data": data, "drawn_here": True}  # fmt: skip
    return None
