"""Writers: how steps get into a table, and how priorities get back.

* :class:`~gear_flow.EpisodeWriter` (``gear_flow.writer``): one episode at a
  time, inserted whole.
* :class:`TrajectoryWriter`: overlapping chunks, items every step or created
  where the caller says (n-step transitions, sequences).
* :class:`VectorWriter`: one step of N environments per call, episodes ending
  independently.
* :class:`PriorityWriter`: priority write-back in the background, in order.
"""

from __future__ import annotations

from .priorities import PriorityWriter
from .trajectory import TrajectoryWriter
from .vector import VectorWriter

__all__ = ["PriorityWriter", "TrajectoryWriter", "VectorWriter"]
