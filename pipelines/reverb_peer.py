"""DeepMind Reverb on the reference workload, as the benchmarks set it beside gear_flow (the ``bench`` extra).

Reverb's items are the windows themselves: each episode is written step by step, and every strict window of
``L`` steps becomes an item (as every step of ours starts one), in a table with a ``Uniform`` or
``Prioritized(0.6)`` sampler.  The tables are written with Reverb's fastest writer on this workload, its
``Writer`` with chunks of ``L`` steps (:func:`write`); its ``TrajectoryWriter`` wrote the same 187,400 items
2.7x slower here (50 s against 19 s), and a ``TrajectoryDataset`` read either's items as fast (19-21 ms a
batch), so the benchmarks time the ``TrajectoryWriter`` writing only.  Batches come from ``TrajectoryDataset.batch(B)``, Reverb's fast path
(its own threads keep samples in flight), each column made a torch tensor; a prioritized batch's priorities
go back with ``mutate_priorities``.  ``pipelines/bench_local.py`` reads a server in its own process (Reverb
then reads the table directly), ``pipelines/bench_remote_peers.py`` one in another process (over gRPC).
Importing this module imports Reverb and TensorFlow.
"""

from __future__ import annotations

import numpy as np
import reverb
import tensorflow as tf
import torch
from common import reference_columns

#: the tables, by name: each one's selector
SELECTORS = {"uniform": reverb.selectors.Uniform, "prioritized": lambda: reverb.selectors.Prioritized(0.6)}


def windows(eps: list[dict], length: int) -> int:
    """Strict windows of ``length`` steps in ``eps``: the items a table holds."""
    return sum(len(e["reward"]) - length + 1 for e in eps)


def tables(names, eps: list[dict], length: int) -> list:
    """A ``reverb.Table`` per name of :data:`SELECTORS`, sized for every window of ``eps``, with the reference
    columns' signature (``[L, ...]`` per column, what a ``TrajectoryDataset`` reads)."""
    signature = {c.name: tf.TensorSpec((length, *c.shape), tf.as_dtype(c.dtype)) for c in reference_columns()}
    size = windows(eps, length)
    return [
        reverb.Table(
            n, SELECTORS[n](), reverb.selectors.Fifo(), size, reverb.rate_limiters.MinSize(1), signature=signature
        )
        for n in names
    ]


def write(client, names, eps: list[dict], length: int, writer: str = "chunks") -> None:
    """Every episode of ``eps`` step by step, each strict window an item of every table of ``names`` (a
    prioritized one's priority uniform in [0.01, 1.01), drawn from seed 0; a uniform one's 1).

    ``writer``: ``"chunks"``, Reverb's ``Writer`` with chunks of ``length`` steps (each window an item over the
    last ``length`` steps appended); ``"trajectory"``, its ``TrajectoryWriter`` (each window an item of the
    last ``length`` references of each column's history).  The same items either way.
    """
    cols = [c.name for c in reference_columns()]
    rng = np.random.default_rng(0)

    def priority(n: str) -> float:
        return float(rng.random() + 0.01) if n == "prioritized" else 1.0

    if writer == "chunks":
        with client.writer(max_sequence_length=length, chunk_length=length) as w:  # (flushed on leaving)
            for e in eps:
                for t in range(len(e["reward"])):
                    w.append({c: e[c][t] for c in cols})
                    if t >= length - 1:  # the window of the L steps up to this one (never across episodes)
                        for n in names:
                            w.create_item(n, length, priority(n))
        return
    if writer != "trajectory":
        raise ValueError(f"writer must be 'chunks' or 'trajectory', got {writer!r}")
    with client.trajectory_writer(num_keep_alive_refs=length) as w:
        for e in eps:
            for t in range(len(e["reward"])):
                w.append({c: e[c][t] for c in cols})
                if t >= length - 1:  # the window of the L steps up to this one
                    window = {c: w.history[c][-length:] for c in cols}
                    for n in names:
                        w.create_item(n, priority(n), window)
            w.end_episode()


def reader(address: str, name: str, batch_size: int, client, rng: np.random.Generator):
    """One batch of table ``name`` at ``address`` per call, its columns torch tensors; a prioritized table's
    ``batch_size`` priorities written back (``mutate_priorities`` through ``client``)."""
    ds = reverb.TrajectoryDataset.from_table_signature(address, name, max_in_flight_samples_per_worker=2 * batch_size)
    it = iter(ds.batch(batch_size, drop_remainder=True))

    def once() -> dict:
        s = next(it)
        batch = {k: torch.from_numpy(v.numpy()) for k, v in s.data.items()}
        if name == "prioritized":
            keys = s.info.key.numpy().tolist()
            client.mutate_priorities(name, updates=dict(zip(keys, (rng.random(batch_size) + 0.01).tolist())))
        return batch

    return once
