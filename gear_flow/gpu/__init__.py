"""GPU backend: CUDA kernels and the ``pinned`` and ``device`` storage tiers.

Importing this package registers the two tiers with
:func:`gear_flow.storage.base.register_tier` and does nothing else: CuPy is
imported when a tier is constructed or a kernel wrapper is used, and the CUDA
sources in ``kernels/`` are compiled (once, memoised, cached on disk by CuPy)
when a kernel is first launched — never at import.

Contents
--------
:mod:`gear_flow.gpu.loader`
    The single memoised loader: one ``cupy.RawModule`` per ``kernels/*.cu``.
:mod:`gear_flow.gpu.ops`
    CUDA twins of :mod:`gear_flow.ops` (``sumtree``, ``maxtree``, ``gather``).
:mod:`gear_flow.gpu.tiers`
    :class:`DeviceTier` and :class:`PinnedTier`.
:mod:`gear_flow.gpu.streams`
    Stream handoff between the gathers and torch.

Examples
--------
>>> import gear_flow.gpu  # registers the tiers, imports no CuPy
>>> from gear_flow.storage.base import _TIERS
>>> {"device", "pinned"} <= set(_TIERS)
True
"""

from __future__ import annotations

from ..storage.base import register_tier
from .tiers import DeviceTier, PinnedTier

register_tier("device", DeviceTier)
register_tier("pinned", PinnedTier)

__all__ = ["DeviceTier", "PinnedTier"]
