"""The one place that compiles the CUDA sources in ``kernels/``.

Each ``kernels/<name>.cu`` becomes one :class:`cupy.RawModule`, built from the
source text with ``#line 1 "<name>.cu"`` prepended (so NVRTC's messages point at
the file, as in CuPy's ``cupyx/scipy/signal/_iir_utils.py``) and with every
template instantiation the wrappers use listed as a ``name_expression``.
Modules are memoised and built lazily: importing this module does not import
CuPy, and nothing is compiled until a kernel is first launched (CuPy then
caches the binary on disk, ``~/.cupy/kernel_cache``).

The kernel folder is, in order: ``$GEAR_FLOW_KERNEL_DIR``; ``gear_flow/_kernels``
(for an installed wheel that ships the sources as package data); the
repository's ``kernels/`` next to the package (source checkouts, editable
installs).
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import DTypeLike

if TYPE_CHECKING:
    import cupy

#: NumPy dtype -> the C++ spelling used in template arguments.
CTYPES = {
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}


def ctype(dtype: DTypeLike) -> str:
    """C++ type name for a NumPy dtype (only those the kernels are instantiated for).

    Parameters
    ----------
    dtype : dtype-like
        int32, int64, float32 or float64.

    Returns
    -------
    str
        ``"int"``, ``"long long"``, ``"float"`` or ``"double"``.

    Raises
    ------
    TypeError
        A dtype no kernel is instantiated for.

    Examples
    --------
    >>> ctype(np.int64)
    'long long'
    """
    try:
        return CTYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(
            f"no kernel instantiation for dtype {np.dtype(dtype)}; available: {sorted(map(str, CTYPES))}"
        ) from None


def expr(name: str, *targs: str) -> str:
    """A name expression, spelled exactly as registered in :data:`SOURCES`.

    Parameters
    ----------
    name : str
        The kernel (a C++ template's name).
    *targs : str
        Its template arguments, C++ spellings (see :func:`ctype`).

    Returns
    -------
    str
        ``name<targ, ...>``, or ``name`` without template arguments.

    Examples
    --------
    >>> expr("f", "int", "double")
    'f<int, double>'
    """
    return f"{name}<{', '.join(targs)}>" if targs else name


def _product(name: str, *axes: tuple[str, ...]) -> list[str]:
    out = [()]
    for axis in axes:
        out = [o + (a,) for o in out for a in axis]
    return [expr(name, *o) for o in out]


_I = ("int", "long long")
_T = ("float", "double")
_OP = ("SumOp", "MaxOp")


@dataclass(frozen=True)
class KernelSource:
    """One ``.cu`` file and what the wrappers instantiate from it.

    Attributes
    ----------
    file : str
        File name inside the kernel folder.
    name_expressions : tuple of str
        Every kernel (template instantiation) fetched with ``get_function``.
    options : tuple of str
        NVRTC options in addition to :data:`COMMON_OPTIONS`.
    """

    file: str
    name_expressions: tuple[str, ...]
    options: tuple[str, ...] = ()


#: Options for every module.  ``-fmad=false`` is not needed by the current
#: sources (no multiply-add pairs in the tree code) but is kept on sumtree so
#: that bitwise parity with the CPU twins survives future edits.
COMMON_OPTIONS: tuple[str, ...] = ("--std=c++17",)

SOURCES: dict[str, KernelSource] = {
    "sumtree": KernelSource(
        "sumtree.cu",
        tuple(
            _product("tree_mark_last", _I)
            + _product("tree_set_marked", _I, _T)
            + _product("tree_reset_owner", _I)
            + _product("tree_repair_level", _OP, _I)
            + _product("tree_rebuild_level", _OP)
            + _product("tree_update_block", _OP, _I, _T)
            + _product("tree_find", _T)
            + _product("tree_sample", _T)
            + ["tree_range_sums", "tree_ring_tail_parts", "sum_in_order"]
        ),
        ("--fmad=false",),
    ),
    "topk": KernelSource(
        "topk.cu",
        tuple(
            _product("topk_histogram", _T)
            + _product("topk_collect", _T)
            + _product("topk_emit", _T)
            + ["topk_select", "topk_bitonic_step", "topk_sort_block"]
        ),
    ),
    "gather": KernelSource("gather.cu", ("gather_windows", "gather_columns")),
}


def kernel_dir() -> Path:
    """Folder holding the ``.cu`` sources (see the module docstring for the search order).

    Returns
    -------
    pathlib.Path
        ``$GEAR_FLOW_KERNEL_DIR`` as given, or the first of
        ``gear_flow/_kernels`` and the repository's ``kernels/`` that holds
        ``gather.cu``.

    Raises
    ------
    FileNotFoundError
        No such folder (the message names where it looked).
    """
    env = os.environ.get("GEAR_FLOW_KERNEL_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent  # gear_flow/
    for cand in (here / "_kernels", here.parent / "kernels"):
        if (cand / SOURCES["gather"].file).is_file():
            return cand
    raise FileNotFoundError(
        f"CUDA sources not found: looked in {here / '_kernels'} and {here.parent / 'kernels'}; "
        "set GEAR_FLOW_KERNEL_DIR to the folder holding gather.cu, sumtree.cu and topk.cu"
    )


def source(name: str) -> str:
    """The text handed to NVRTC for module ``name``: ``#line 1 "<file>"`` + the file.

    Parameters
    ----------
    name : str
        A key of :data:`SOURCES` (``sumtree``, ``topk``, ``gather``).

    Returns
    -------
    str
        The source with its ``#line`` directive.

    Raises
    ------
    KeyError
        An unknown module.
    FileNotFoundError
        The kernel folder or file is missing.
    """
    try:
        src = SOURCES[name]
    except KeyError:
        raise KeyError(f"unknown kernel module {name!r}; available: {sorted(SOURCES)}") from None
    text = (kernel_dir() / src.file).read_text()
    return f'#line 1 "{src.file}"\n{text}'


def options(name: str) -> tuple[str, ...]:
    """NVRTC options of module ``name``: :data:`COMMON_OPTIONS` plus its own.

    Parameters
    ----------
    name : str
        A key of :data:`SOURCES`.

    Returns
    -------
    tuple of str
        The options, e.g. ``("--std=c++17", "--fmad=false")`` for sumtree.

    Raises
    ------
    KeyError
        An unknown module.
    """
    return COMMON_OPTIONS + SOURCES[name].options


_lock = threading.Lock()


@functools.cache
def _module(name: str):
    import cupy

    src = SOURCES[name]
    return cupy.RawModule(code=source(name), options=options(name), name_expressions=list(src.name_expressions))


def module(name: str) -> cupy.RawModule:
    """The memoised :class:`cupy.RawModule` of ``kernels/<name>.cu`` (compiled on first launch).

    Parameters
    ----------
    name : str
        A key of :data:`SOURCES`.

    Returns
    -------
    cupy.RawModule
        Built once per process with every name expression of the source.

    Raises
    ------
    KeyError
        An unknown module.
    ImportError
        CuPy is not installed.
    """
    with _lock:
        return _module(name)


@functools.cache
def _function(name: str, expression: str, device_id: int):
    # keyed by device: a loaded function belongs to one device's context
    if expression not in SOURCES[name].name_expressions:
        raise KeyError(f"{expression!r} is not instantiated in {SOURCES[name].file}; add it to loader.SOURCES")
    return module(name).get_function(expression)


def function(name: str, expression: str) -> cupy.RawKernel:
    """The kernel ``expression`` of module ``name``, for the current device.

    Parameters
    ----------
    name : str
        A key of :data:`SOURCES`.
    expression : str
        One of its name expressions (build it with :func:`expr`).

    Returns
    -------
    cupy.RawKernel
        Memoised per (module, expression, device).

    Raises
    ------
    KeyError
        ``expression`` is not instantiated in the source (add it to
        :data:`SOURCES`).
    """
    import cupy

    return _function(name, expression, cupy.cuda.runtime.getDevice())
