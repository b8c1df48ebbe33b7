"""The one place that decides NumPy/pandas versus CuPy/cuDF.

Everything here is lazy: importing this module imports neither CuPy nor cuDF
nor torch, and no function creates a CUDA context except when a GPU tier is
actually asked for.  A storage tier decides these things:

============  ==================  =====================  ===================  =====================
tier          ring arrays         sample output buffers  frames               selection trees
============  ==================  =====================  ===================  =====================
``host``      NumPy               NumPy (CPU tensors)    pandas               NumPy, numba twins
``pinned``    NumPy, page-locked  CuPy (CUDA tensors)    pandas               NumPy, numba twins
``device``    CuPy                CuPy (CUDA tensors)    cuDF                 CuPy, CUDA kernels
============  ==================  =====================  ===================  =====================

Pinned rings are NumPy arrays to the host (inserts are plain host writes) and
device-addressable memory to the kernels, which gather from them straight
into device buffers.

Examples
--------
>>> import numpy as np
>>> from gear_flow import backend
>>> backend.array_module("host") is np
True
>>> isinstance(backend.gpu_available(), bool)
True
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from .errors import GearFlowError, SpecError

if TYPE_CHECKING:
    import torch

    from .storage.base import StorageTier


class BackendUnavailableError(GearFlowError, RuntimeError):
    """A GPU tier or GPU library was asked for where there is none.

    Parameters
    ----------
    what : str
        What was asked for (a tier, a module).
    reason : str
        Why it is unavailable; a reason mentioning ``import`` gets the hint to
        install the GPU extra, any other the hint to run where there is a
        device.

    Attributes
    ----------
    what : str
        What was asked for (a tier, a module).
    reason : str
        Why it is unavailable (package missing, no usable device).
    """

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        hint = (
            "install the extra 'gear-flow[gpu-cu13]' (or '[gpu-cu12]'), or use tier='host'"
            if "import" in reason
            else "run on a machine with a CUDA device, or use tier='host'"
        )
        super().__init__(f"{what} needs CuPy and a usable CUDA device: {reason} ({hint})")


#: tier -> (module of the ring arrays, module of the sample output, frame module)
_TIERS: dict[str, tuple[str, str, str]] = {
    "host": ("numpy", "numpy", "pandas"),
    "shared": ("numpy", "numpy", "pandas"),  # host arrays in shared-memory segments
    "disk": ("numpy", "numpy", "pandas"),  # host arrays mapped from files
    "pinned": ("numpy", "cupy", "pandas"),
    "device": ("cupy", "cupy", "cudf"),
}


def tier_name(tier: str | StorageTier) -> str:
    """The name of a tier given as a name or as a :class:`~gear_flow.storage.StorageTier`.

    Parameters
    ----------
    tier : str or StorageTier
        A tier name, or an object with a ``name`` attribute.

    Returns
    -------
    str
        ``host``, ``shared``, ``disk``, ``pinned`` or ``device``.

    Raises
    ------
    SpecError
        Not a tier the backend knows.
    """
    name = tier if isinstance(tier, str) else getattr(tier, "name", None)
    if name not in _TIERS:
        raise SpecError(f"storage tier {tier!r} is unknown to the backend; available: {sorted(_TIERS)}")
    return name


@functools.cache
def _cupy_status() -> str | None:
    """None when CuPy imports and sees a device, else the reason why not."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install raising at import
        return f"cupy cannot be imported ({type(e).__name__}: {e})"
    try:
        if not cupy.cuda.is_available():  # False, without raising, when there is no device or driver
            return "cupy sees no CUDA device"
    except Exception as e:
        return f"cupy cannot query devices ({type(e).__name__}: {e})"
    return None


def gpu_available() -> bool:
    """True when CuPy is importable and a CUDA device is usable; never raises.

    Memoised; ``gpu_available.cache_clear()`` forgets the answer.  Creates no
    CUDA context (``cupy.cuda.is_available`` only queries the driver).

    Returns
    -------
    bool
        Whether the GPU tiers can be used here.
    """
    return _cupy_status() is None


gpu_available.cache_clear = _cupy_status.cache_clear  # type: ignore[attr-defined]


def require_gpu(what: str) -> ModuleType:
    """The ``cupy`` module, or :class:`BackendUnavailableError` naming ``what`` needed it.

    Parameters
    ----------
    what : str
        What needs the GPU, for the message (``"storage tier 'device'"``).

    Returns
    -------
    module
        ``cupy``.

    Raises
    ------
    BackendUnavailableError
        CuPy cannot be imported or sees no usable device.
    """
    reason = _cupy_status()
    if reason is not None:
        raise BackendUnavailableError(what, reason)
    import cupy

    return cupy


def _load(modname: str, what: str):
    if modname == "numpy":
        return np
    if modname == "cupy":
        return require_gpu(what)
    try:
        return importlib.import_module(modname)
    except ImportError as e:
        raise BackendUnavailableError(what, f"{modname} cannot be imported ({e})") from None


def array_module(tier: str | StorageTier = "host") -> ModuleType:
    """Module of a tier's ring arrays: ``numpy`` (host, shared, pinned) or ``cupy`` (device).

    Parameters
    ----------
    tier : str or StorageTier, default "host"
        ``host``, ``shared``, ``pinned`` or ``device``, or a tier instance.

    Returns
    -------
    module
        ``numpy`` or ``cupy``.

    Raises
    ------
    SpecError
        An unknown tier.
    BackendUnavailableError
        ``device`` where there is no usable GPU.
    """
    name = tier_name(tier)
    return _load(_TIERS[name][0], f"storage tier {name!r}")


def output_module(tier: str | StorageTier = "host") -> ModuleType:
    """Module of the sample output buffers of a tier: ``numpy`` (host, shared) or ``cupy`` (pinned, device).

    Parameters
    ----------
    tier : str or StorageTier, default "host"
        ``host``, ``shared``, ``pinned`` or ``device``, or a tier instance.

    Returns
    -------
    module
        ``numpy`` or ``cupy``.

    Raises
    ------
    SpecError
        An unknown tier.
    BackendUnavailableError
        ``pinned`` or ``device`` where there is no usable GPU.
    """
    name = tier_name(tier)
    return _load(_TIERS[name][1], f"sample output of tier {name!r}")


def frame_module(tier: str | StorageTier = "host") -> ModuleType:
    """Frame library of a tier: ``pandas`` (host, shared, pinned) or ``cudf`` (device).

    Parameters
    ----------
    tier : str or StorageTier, default "host"
        ``host``, ``shared``, ``pinned`` or ``device``, or a tier instance.

    Returns
    -------
    module
        ``pandas`` or ``cudf``.

    Raises
    ------
    SpecError
        An unknown tier.
    BackendUnavailableError
        The library cannot be imported.
    """
    name = tier_name(tier)
    return _load(_TIERS[name][2], f"frames of tier {name!r}")


@dataclass(frozen=True)
class SelectionOps:
    """The tree operations a tier's selectors run with (see :func:`selection_ops`).

    Attributes
    ----------
    sumtree : module
        :mod:`gear_flow.ops.sumtree` (numba) or :mod:`gear_flow.gpu.ops.sumtree` (kernels).
    maxtree : module
        :mod:`gear_flow.ops.maxtree` (numba) or :mod:`gear_flow.gpu.ops.maxtree` (kernels).
    on_device : bool
        Are the trees CuPy arrays (inputs uploaded, results copied back explicitly)?
    """

    sumtree: ModuleType
    maxtree: ModuleType
    on_device: bool


#: tier -> (sum-tree ops, max-tree ops) of its selectors.  Two algorithms because the trees
#: belong next to the rings: on the host-memory tiers (pinned rings are host memory too) a
#: batch walks the trees in the CPU's caches with the numba twins, and moving them to a GPU
#: would add a round trip per draw; on ``device`` the kernels walk trees that never leave
#: device memory, so a batch moves only its uniforms up and its slots down.
_SELECTION: dict[str, tuple[str, str]] = {
    "host": ("gear_flow.ops.sumtree", "gear_flow.ops.maxtree"),
    "shared": ("gear_flow.ops.sumtree", "gear_flow.ops.maxtree"),
    "disk": ("gear_flow.ops.sumtree", "gear_flow.ops.maxtree"),
    "pinned": ("gear_flow.ops.sumtree", "gear_flow.ops.maxtree"),
    "device": ("gear_flow.gpu.ops.sumtree", "gear_flow.gpu.ops.maxtree"),
}


def selection_ops(tier: str | StorageTier = "host") -> SelectionOps:
    """The sum-tree and max-tree operations of a tier's selectors (the one dispatch point).

    Imports lazily: the numba twins for ``host``, ``shared`` and ``pinned``, the
    CUDA kernels' wrappers for ``device`` (which needs CuPy and a usable device,
    else :class:`BackendUnavailableError`).  Creates no CUDA context itself.

    Parameters
    ----------
    tier : str or StorageTier, default "host"
        ``host``, ``shared``, ``pinned`` or ``device``, or a tier instance.

    Returns
    -------
    SelectionOps
        The tier's ``sumtree`` and ``maxtree`` modules and ``on_device``.

    Raises
    ------
    SpecError
        An unknown tier.
    BackendUnavailableError
        ``device`` where there is no usable GPU.

    Examples
    --------
    >>> from gear_flow import backend
    >>> backend.selection_ops("host").sumtree.__name__
    'gear_flow.ops.sumtree'
    """
    name = tier_name(tier)
    sum_mod, max_mod = _SELECTION[name]
    on_device = sum_mod.startswith("gear_flow.gpu.")
    if on_device:
        require_gpu(f"selection on storage tier {name!r}")
    return SelectionOps(importlib.import_module(sum_mod), importlib.import_module(max_mod), on_device)


def output_on_device(tier: str | StorageTier = "host") -> bool:
    """Do samples of this tier come out in device memory (as CUDA tensors)?

    Parameters
    ----------
    tier : str or StorageTier, default "host"
        ``host``, ``shared``, ``pinned`` or ``device``, or a tier instance.

    Returns
    -------
    bool
        True for ``pinned`` and ``device``.

    Raises
    ------
    SpecError
        An unknown tier.
    """
    return _TIERS[tier_name(tier)][1] == "cupy"


def is_device_array(a: object) -> bool:
    """Is ``a`` a CUDA array (CuPy, or anything exposing ``__cuda_array_interface__``)?

    Parameters
    ----------
    a : object
        Anything; nothing is imported to answer.

    Returns
    -------
    bool
        True when ``a`` has ``__cuda_array_interface__``.

    Examples
    --------
    >>> import numpy as np
    >>> is_device_array(np.zeros(3))
    False
    """
    return hasattr(a, "__cuda_array_interface__")


def to_torch(a: object) -> torch.Tensor:
    """A torch tensor aliasing ``a``: ``torch.from_numpy`` for host arrays, DLPack for device ones.

    For a device array, torch's current stream is made to wait for CuPy's
    current stream (the DLPack protocol's ``stream`` handshake).

    Parameters
    ----------
    a : array_like
        A NumPy array (or anything ``np.asarray`` reads) or a device array
        supporting DLPack.

    Returns
    -------
    torch.Tensor
        Shares ``a``'s memory (no copy), same shape and dtype, on the CPU or
        on ``a``'s device.
    """
    import torch

    if is_device_array(a):
        return torch.from_dlpack(a)
    return torch.from_numpy(np.asarray(a))
