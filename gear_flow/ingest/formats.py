"""The dataset formats :func:`~gear_flow.ingest.ingest` knows, by name, and a guess from a path."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import SpecError
from . import d4rl, minari, parquet
from .common import Format

#: format name -> Format (plan + partition reader); a registry, never a name built from a string
FORMATS: dict[str, Format] = {f.name: f for f in (minari.FORMAT, d4rl.FORMAT, parquet.FORMAT)}


def detect_format(source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> str:
    """``minari``, ``d4rl`` or ``parquet`` from the shape of ``source`` (paths are not opened).

    Parameters
    ----------
    source : str, os.PathLike, or sequence of them
        A dataset path, glob, or list of Parquet files.

    Returns
    -------
    str
        ``"parquet"`` for lists, globs, ``.parquet`` files and directories of
        them; ``"minari"`` for a Minari dataset directory or its ``main_data.hdf5``;
        ``"d4rl"`` for any other ``.hdf5``/``.h5`` file.

    Raises
    ------
    SpecError
        Nothing tells the format.
    """
    if isinstance(source, (list, tuple)):
        return "parquet"
    s = str(source)
    p = Path(s)
    if any(ch in s for ch in "*?[") or p.suffix == ".parquet":
        return "parquet"
    if p.is_dir():
        if any((d / f).is_file() for d in (p / "data", p) for f in (minari.MAIN_FILE, minari.METADATA_FILE)):
            return "minari"  # before the *.parquet search: Minari's parquet storage is not our step-table layout
        if any(p.rglob("*.parquet")):
            return "parquet"
    if p.is_file() and p.suffix in (".hdf5", ".h5"):
        return "minari" if p.name == minari.MAIN_FILE else "d4rl"
    raise SpecError(f"cannot tell the format of {s!r}; pass fmt= one of {sorted(FORMATS)}")
