"""Item keys: one int64 per item, never reused.

``key = shard << 56 | seq``: ``shard`` (7 bits) is the owning shard, ``seq``
(56 bits) the item's sequence number in that shard: the absolute step position
for step items, the episode's sequence number for episode items.  The slot of
an item is ``seq % capacity`` and its generation ``seq // capacity``, so a key
whose slot was reused by newer data is recognised as stale and never applied
to the new item.
"""

from __future__ import annotations

import numpy as np

SHARD_SHIFT = 56
SEQ_MASK = (1 << SHARD_SHIFT) - 1


def encode(shard: int, seqs: np.ndarray) -> np.ndarray:
    return (np.int64(shard) << np.int64(SHARD_SHIFT)) | np.asarray(seqs, dtype=np.int64)


def decode(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keys = np.asarray(keys, dtype=np.int64)
    return keys >> np.int64(SHARD_SHIFT), keys & np.int64(SEQ_MASK)
