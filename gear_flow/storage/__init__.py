"""Storage: column rings, the episode index, and storage tiers."""

from .base import HostTier, StorageTier, get_tier, register_tier
from .episodes import EpisodeIndex
from .ring import ColumnRing

__all__ = ["ColumnRing", "EpisodeIndex", "HostTier", "StorageTier", "get_tier", "register_tier"]
