"""The offline pipeline's learner side: windows from the table feed a Decision Transformer."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gear_flow as gf
from gear_flow.ingest import episode_columns, ingest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    import make_dataset

    return make_dataset.main(["--out", str(tmp_path_factory.mktemp("data")), "--episodes", "40", "--seed", "3"])


@pytest.fixture(scope="module")
def table(dataset):
    t = gf.LocalTable(gf.TableSpec(episode_columns(dataset["obs_dim"]), capacity=40_000), boundary="pad_head", seed=0)
    rep = ingest(t, dataset["paths"]["minari"])
    assert rep.episodes_stored == dataset["episodes"] == 40
    return t


def test_windows_carry_shapes_masks_and_return_to_go(table, dataset):
    K = 10
    b = table.sample(64, K)
    assert b["obs"].shape == (64, K, dataset["obs_dim"]) and b["action"].shape == (64, K)
    mask, rtg, rew, ts = b.mask.numpy(), b["rtg"].numpy(), b["reward"].numpy(), b["timestep"].numpy()
    done, trunc = b["done"].numpy(), b["truncated"].numpy()
    assert mask[:, -1].all()  # pad_head: the window ends on a real step
    for r in range(64):
        valid = np.flatnonzero(mask[r])
        assert np.array_equal(valid, np.arange(K - len(valid), K))  # padding only before the start
        assert np.array_equal(ts[r, valid], b.timesteps[r].item() + np.arange(len(valid)))
        assert not rtg[r, ~mask[r]].any() and not rew[r, ~mask[r]].any()
        # return-to-go: R_t - R_{t+1} = r_t inside the window; R_T = r_T on the episode's last step
        np.testing.assert_allclose(rtg[r, valid[:-1]] - rtg[r, valid[1:]], rew[r, valid[:-1]], rtol=1e-5, atol=1e-4)
        last = valid[-1]
        if done[r, last] or trunc[r, last]:
            assert rtg[r, last] == pytest.approx(rew[r, last])


def test_short_training_lowers_the_loss(table, dataset):
    from decision_transformer import DecisionTransformer

    torch.manual_seed(0)
    model = DecisionTransformer(dataset["obs_dim"], dataset["n_actions"], context=10, max_timestep=512, d_model=32)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for batch in gf.Stream(table, 32, 10, columns=("obs", "action", "rtg", "timestep"), num_batches=150, seed=0):
        loss = model.loss(batch)
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-20:]) < 0.85 * np.mean(losses[:20]), (np.mean(losses[:20]), np.mean(losses[-20:]))


@pytest.mark.slow
def test_pipeline_end_to_end_small(dataset, tmp_path):
    import offline_dt

    data_dir = Path(dataset["paths"]["minari_root"]).parent
    s = offline_dt.main(
        [
            "--data",
            str(data_dir),
            "--episodes",
            "40",
            "--out",
            str(tmp_path / "run"),
            "--steps",
            "30",
            "--eval-every",
            "30",
            "--eval-episodes",
            "1",
            "--no-progress",
        ]
    )
    assert Path(s["plot"]).exists() and Path(s["checkpoint"]).exists()
    assert s["ingest"]["episodes"] == 40 and sum(s["table"]["shards"]) == s["table"]["size"]
    assert s["table"]["sampled"] == 30 * 64
