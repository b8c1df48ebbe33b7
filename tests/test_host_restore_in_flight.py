"""A shard restored onto a worker that already hosts the table leaves that table's work in flight there alone.

No cluster: two shard hosts (workers) over local shards.  Shard 1's host
checkpoints it; the other host, holding shard 0 with a two-phase sample
drawn (and an insert staged), then takes shard 1 from that checkpoint, as
``restore_shard`` does when shard 1's worker was lost and the least loaded
worker left is shard 0's.  The distributed queue test that restores a shard
under writers and samplers got stuck this way: a sample's finish found its
parts forgotten, so the items it handed out never expired while the
coordinator's limiter counted them sampled (a queue then holds items that
no batch is admitted for).
"""

from __future__ import annotations

import numpy as np
import pytest

import gear_flow as gf
from gear_flow.distributed.host import ShardHost
from gear_flow.table.config import TableConfig

X = (gf.ColumnSpec("x", (), np.float32),)


def part(shard, tags):
    return {
        "shard": shard,
        "chunks": [{"x": np.full(1, t, np.float32)} for t in tags],
        "lengths": np.ones(len(tags), np.int64),
        "episode_ids": np.asarray(tags),
        "stamps": np.asarray(tags),
        "priorities": None,
    }


def queue_hosts(tmp_path):
    """Host ``a`` with shard 0 (tags 0..3), host ``b`` with shard 1 (tags 10..12) checkpointed to ``tmp_path``."""
    cfg = TableConfig.build(
        gf.TableSpec(X, capacity=64, num_shards=2), sampler=gf.Fifo(), remover=gf.Fifo(), max_times_sampled=1
    ).to_dict()
    a, b = ShardHost(), ShardHost()
    a.create("t", cfg, [0])
    b.create("t", cfg, [1])
    a.write("t", "w0", [part(0, range(4))])
    b.write("t", "w1", [part(1, range(10, 13))])
    return cfg, a, b, b.checkpoint("t", tmp_path)


def tags(host, shard):
    s = host.shard("t", shard)
    with s.lock:
        return sorted(s.ring.columns["x"][s.active == 1].astype(int).tolist())


def test_a_sample_drawn_before_a_shard_is_restored_beside_it_expires_what_it_handed_out(tmp_path):
    cfg, a, _, files = queue_hosts(tmp_path)
    drawn = a.sample_part("t", 1, "pad_tail", ("x",), 0, slots={0: [0, 1]}, txn="s", record=False)
    assert drawn[0]["data"]["x"].view(np.float32).ravel().tolist() == [0.0, 1.0]
    assert a.restore("t", cfg, str(tmp_path), files) == {1: 3}
    assert a.finish_sample("t", "s", commit=True) == {0: 2}  # before the fix: {} (the sample unknown here)
    assert tags(a, 0) == [2, 3] and tags(a, 1) == [10, 11, 12]


def test_an_insert_staged_before_a_shard_is_restored_beside_it_applies(tmp_path):
    cfg, a, _, files = queue_hosts(tmp_path)
    assert a.stage("t", "ins", [part(0, [4, 5])]) == 2
    a.restore("t", cfg, str(tmp_path), files)
    assert a.apply("t", "ins")["items"] == {0: 2}  # before the fix: SpecError, not staged on this worker
    assert tags(a, 0) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("commit", [True, False])
def test_a_sample_drawn_from_a_shard_replaced_by_a_restore_finishes_on_the_copy_it_drew_from(tmp_path, commit):
    """Shard 1 replaced in place by its checkpoint (``replace=True`` onto its own worker) while a sample has
    two of its items pending: the finish reports them (the coordinator counts them by the incarnation the
    sample drew from) and leaves the restored copy as the checkpoint has it."""
    cfg, _, b, files = queue_hosts(tmp_path)
    b.sample_part("t", 1, "pad_tail", ("x",), 0, slots={1: [0, 1]}, txn="s", record=False)
    b.restore("t", cfg, str(tmp_path), files)
    assert b.finish_sample("t", "s", commit=commit) == {1: 2}
    assert tags(b, 1) == [10, 11, 12]
