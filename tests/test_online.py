"""The online loop of pipelines/online_dqn.py: actors on workers → prioritized table → learner.

A short run on a real LocalCluster (2 worker processes, 2 actors each); learning
itself is shown by the full run, not asserted here.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"
sys.path.insert(0, str(PIPELINES))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_online_dqn_loop_end_to_end(tmp_path):
    pytest.importorskip("gymnasium")
    import online_dqn

    B, spi, min_size = 32, 8, 300
    s = online_dqn.main(
        [
            "--env-steps", "2500", "--batch-size", str(B), "--samples-per-insert", str(spi),
            "--min-size", str(min_size), "--capacity", "600", "--chunk", "32",
            "--eval-every", "100000", "--eval-episodes", "1", "--random-episodes", "5",
            "--trace-every", "20", "--publish-every", "20", "--refresh-every", "20",
            "--out", str(tmp_path), "--no-progress",
        ]
    )  # fmt: skip
    updates = int((2500 - min_size) * spi / B)
    table, totals, rate = s["table"], s["table"]["totals"], s["rate"]

    # actors: all returned (stopped by the event), nothing left on the cluster
    assert s["actor_status"] == ["finished"] * 4 and s["tasks_left"] == 0
    assert all(a["steps"] > 0 and a["inserts"] > 0 and a["versions"] >= 1 for a in s["actors"])
    # both workers' shards hold episodes, each written by the actors running on that worker
    shards = table["shards"]
    assert len({x["worker"] for x in shards}) == 2
    for x in shards:
        assert x["inserted_episodes"] == sum(a["inserts"] for a in s["actors"] if a["worker"] == x["worker"]) > 0

    # the learner sampled every batch and wrote every priority back (stale: items evicted meanwhile)
    assert s["learner_updates"] == updates
    assert totals["sampled"] == rate["samples"] == updates * B
    p = s["priorities"]
    assert p["applied"] > 0 and p["applied"] + p["stale"] == updates * B
    assert totals["stale_updates"] == p["stale"]

    # the limiter kept samples / inserts inside its error buffer all along
    for t in rate["trace"]:
        assert rate["min_diff"] <= t["diff"] <= rate["max_diff"], (t, rate["min_diff"], rate["max_diff"])
    assert rate["allowed"][0] <= rate["observed"] <= rate["allowed"][1]

    # counts reconcile (the small capacity makes the rings overwrite old episodes)
    assert totals["evicted"] > 0
    assert totals["inserted"] == (
        table["size"] + totals["evicted"] + totals["removed"] + totals["deleted"] + totals["expired"]
    )
    assert table["size"] == table["coordinator_size"]

    assert s["loss_finite"] and math.isfinite(s["first_loss"]) and math.isfinite(s["last_loss"])
    assert 5 < s["random_return"] < 100  # the baseline was measured (random CartPole: ~20)
    assert Path(s["plot"]).stat().st_size > 0
    assert json.loads((tmp_path / "summary.json").read_text())["learner_updates"] == updates
