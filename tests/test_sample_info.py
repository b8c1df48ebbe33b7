"""SampleBatch carries each item's priority and times sampled (Reverb's SampleInfo) and becomes a TensorDict."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import episode, make_spec

import gear_flow as gf


def test_batch_reports_priorities_as_drawn():
    table = gf.LocalTable(make_spec(capacity=128), sampler=gf.Prioritized(alpha=1.0), seed=0)
    table.insert([episode(1, 10)], priorities=np.arange(1, 11, dtype=np.float64))
    b = table.sample(64, 1)
    # the stored priority of each drawn item: t (0-based) + 1, and probabilities follow from it
    assert torch.equal(b.priorities, b["t"][:, 0].double() + 1)
    assert torch.allclose(b.probabilities, b.priorities / 55)
    table.update_priorities(b.keys[:1].numpy(), [100.0])
    assert table.sample(1, 1, rng=np.random.default_rng(1)).priorities.item() == 100.0  # 100 / 145 of the mass


def test_batch_reports_times_sampled_where_the_table_counts_them():
    table = gf.LocalTable(make_spec(capacity=128), sampler=gf.Uniform(), max_times_sampled=1000, seed=0)
    table.insert([episode(1, 4)])
    seen = {}
    for _ in range(10):
        b = table.sample(8, 1)
        for k in b.keys.tolist():  # duplicates in a batch count once each
            seen[k] = seen.get(k, 0) + 1
        counts = dict(zip(b.keys.tolist(), b.times_sampled.tolist()))
        assert all(counts[k] == seen[k] for k in counts)
    uncounted = gf.LocalTable(make_spec(capacity=64))
    uncounted.insert([episode(1, 4)])
    assert uncounted.sample(4, 1).times_sampled.tolist() == [-1] * 4  # not counted by this table


def test_batch_as_a_tensordict_with_torchrl_names():
    pytest.importorskip("tensordict")
    table = gf.LocalTable(make_spec(capacity=128), sampler=gf.Prioritized(alpha=1.0, beta=0.5), seed=0)
    table.insert([episode(1, 10), episode(2, 6)])
    b = table.sample(8, 3)
    td = b.to_tensordict(columns={"done": ("next", "done")})
    assert td.batch_size == torch.Size([8])
    assert td["obs"].shape == (8, 3, 3) and td["next", "done"].shape == (8, 3)
    assert td["obs"].data_ptr() == b["obs"].data_ptr()  # the batch's own tensors
    assert torch.equal(td["index"], b.keys) and torch.equal(td["_weight"], b.weights)
    assert torch.equal(td["priority"], b.priorities) and td["mask"].dtype == torch.bool
    # a TorchRL-style learner step: update priorities from the TensorDict's own index
    table.update_priorities(td["index"].numpy(), np.full(8, 2.0))
    with gf.Stream(table, 4, 2, num_batches=2, as_tensordict=True) as stream:
        tds = list(stream)
    assert [tuple(t.batch_size) for t in tds] == [(4,), (4,)] and "index" in tds[0].keys()


def test_a_column_named_like_a_batch_field_keeps_its_tensordict_key():
    """A column whose name is a per-item field's key (``timestep`` of episode_columns, a ``priority`` the
    user keeps per step) was overwritten by the field in the TensorDict: ``td["timestep"]`` was the windows' first
    timesteps ``[B]``, not the column ``[B, L]``.  The column keeps its key, the field is left out unless
    ``names`` gives it one, and a key given twice on purpose is refused."""
    pytest.importorskip("tensordict")
    from gear_flow.errors import SpecError
    from gear_flow.ingest import episode_columns

    spec = gf.TableSpec((*episode_columns(2), gf.ColumnSpec("priority", (3,), np.float32)), capacity=64)
    table = gf.LocalTable(spec, seed=0)
    T = 5
    table.insert({"obs": np.zeros((T, 2), np.float32), "action": np.zeros(T, np.int64), "reward": np.ones(T, np.float32),
                  "done": np.arange(T) == T - 1, "truncated": np.zeros(T, bool), "rtg": np.zeros(T, np.float32),
                  "timestep": np.arange(T) + 100, "priority": np.ones((T, 3), np.float32)})  # fmt: skip
    b = table.sample(4, 2, boundary="pad_tail")
    td = b.to_tensordict()
    assert td["timestep"].shape == (4, 2) and torch.equal(td["timestep"], b["timestep"])
    assert td["priority"].shape == (4, 2, 3) and torch.equal(td["priority"], b["priority"])
    assert torch.equal(td["mask"], b.mask) and torch.equal(td["index"], b.keys)  # the other fields as before
    td = b.to_tensordict(names={"timesteps": "window_start", "priorities": "item_priority"})
    assert torch.equal(td["window_start"], b.timesteps) and td["item_priority"].data_ptr() == b.priorities.data_ptr()
    assert torch.equal(td["timestep"], b["timestep"])
    with pytest.raises(SpecError, match="column 'timestep' and the batch's timesteps would both be"):
        b.to_tensordict(names={"timesteps": "timestep"})
    with pytest.raises(SpecError, match="column 'reward' and the batch's weights would both be"):
        b.to_tensordict(columns={"reward": "_weight"})
