"""Storage tiers: where a shard's column rings live.

``host`` (NumPy, the CPU backend) is built in.  ``pinned`` (page-locked host
memory that GPU kernels read directly over UVA) and ``device`` (CuPy) are
provided by :mod:`gear_flow.gpu` and registered lazily, so that importing
gear_flow never imports CuPy or touches CUDA.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from ..errors import SpecError


class StorageTier(ABC):
    """Allocates the arrays of one shard and knows how to gather from them."""

    #: tier name used in specs and configuration
    name: str = ""

    @abstractmethod
    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of the tier (NumPy or CuPy)."""

    @abstractmethod
    def gather_windows(
        self, src: np.ndarray, src_start: np.ndarray, dst_offset: np.ndarray, n_valid: np.ndarray, out: np.ndarray
    ) -> None:
        """Copy windows of ``src`` (``[cap, nbytes]`` uint8) into ``out`` (``[B, L, nbytes]`` uint8).

        Semantics: :func:`gear_flow.ops.gather.gather_windows`.
        """

    def empty_output(self, shape: tuple[int, ...], dtype=np.uint8) -> np.ndarray:
        """A buffer this tier's :meth:`gather_windows` can write: host memory here, device memory
        for the GPU tiers (which gather into device buffers)."""
        return np.empty(shape, dtype=dtype)

    def write_rows(self, dst: np.ndarray, pos: int, rows: np.ndarray) -> None:
        """Write ``rows`` into ring ``dst`` at ``pos`` (wrapping); device rows are copied to the host first."""
        from ..ops.gather import scatter_rows

        if hasattr(rows, "__cuda_array_interface__"):
            rows = rows.get()
        scatter_rows(dst, pos, rows)

    def write_chunks(self, dst: np.ndarray, pos: int, parts: list) -> None:
        """Write ``parts`` (arrays ``[T_k, *row]``) back to back into ring ``dst`` from ``pos`` (wrapping).

        One call per column of an insert; tiers for which a call costs more
        than the bytes (a device copy per episode) batch them.
        """
        cap = dst.shape[0]
        for rows in parts:
            self.write_rows(dst, pos, rows)
            pos = (pos + rows.shape[0]) % cap

    def read_rows(self, src: np.ndarray, pos: int, n: int) -> np.ndarray:
        """Copy ``n`` rows starting at ring ``pos`` (wrapping) to host memory."""
        cap = src.shape[0]
        idx = (pos + np.arange(n)) % cap
        return np.asarray(src[idx])


class HostTier(StorageTier):
    """NumPy arrays in ordinary host memory; windows gathered by the numba twin."""

    name = "host"

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def gather_windows(
        self, src: np.ndarray, src_start: np.ndarray, dst_offset: np.ndarray, n_valid: np.ndarray, out: np.ndarray
    ) -> None:
        from ..ops.gather import gather_windows

        gather_windows(src, src_start, dst_offset, n_valid, out)


_TIERS: dict[str, Callable[[], StorageTier]] = {"host": HostTier}


def register_tier(name: str, factory: Callable[[], StorageTier]) -> None:
    """Make a tier available by name (the GPU module registers ``pinned`` and ``device``)."""
    _TIERS[name] = factory


def get_tier(tier: str | StorageTier) -> StorageTier:
    """The tier object for a name (importing the GPU tiers on first use)."""
    if isinstance(tier, StorageTier):
        return tier
    if tier not in _TIERS and tier in ("pinned", "device"):
        from .. import gpu  # noqa: F401  registers the GPU tiers
    if tier not in _TIERS and tier == "shared":
        from . import shared  # noqa: F401  registers the shared-memory tier

    try:
        return _TIERS[tier]()
    except KeyError:
        raise SpecError(
            f"storage tier {tier!r} is unknown; available: {sorted(set(_TIERS) | {'pinned', 'device'})}"
        ) from None
