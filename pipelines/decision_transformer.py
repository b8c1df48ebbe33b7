"""A small Decision Transformer (Chen et al., 2021) for discrete-action tasks, in torch.

Tokens per step: return-to-go ``R_t``, state ``s_t``, action ``a_t``, each
embedded to ``d_model`` with a learned timestep embedding added; a causal
transformer runs over the interleaved sequence ``R_1, s_1, a_1, R_2, ...`` and
the action ``a_t`` is predicted from the output at ``s_t``.  Windows come from
the replay table right-aligned (``boundary="pad_head"``): padding sits before
the episode start and is masked out of attention and of the loss.
"""

from __future__ import annotations

import torch
from torch import nn


class DecisionTransformer(nn.Module):
    """Return-conditioned policy over windows of ``context`` steps.

    Parameters
    ----------
    obs_dim, num_actions : int
    context : int
        Window length ``K``.
    max_timestep : int
        Size of the timestep embedding.
    d_model, layers, heads : int
    rtg_scale : float
        Returns-to-go are divided by this before embedding.
    """

    def __init__(
        self,
        obs_dim,
        num_actions,
        context=20,
        max_timestep=1024,
        d_model=64,
        layers=2,
        heads=2,
        dropout=0.1,
        rtg_scale=100.0,
    ):
        super().__init__()
        self.context, self.num_actions, self.rtg_scale, self.heads = context, num_actions, rtg_scale, heads
        self.embed_rtg = nn.Linear(1, d_model)
        self.embed_obs = nn.Linear(obs_dim, d_model)
        self.embed_act = nn.Embedding(num_actions + 1, d_model)  # the last id is "no action yet"
        self.embed_t = nn.Embedding(max_timestep, d_model)
        self.ln = nn.LayerNorm(d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)  # norm_first: no fast path
        self.head = nn.Linear(d_model, num_actions)
        self.register_buffer(
            "causal", torch.triu(torch.ones(3 * context, 3 * context, dtype=torch.bool), 1), persistent=False
        )

    def forward(self, rtg, obs, action, timestep, mask):
        """Action logits ``[B, L, num_actions]`` from ``rtg [B, L]``, ``obs [B, L, obs_dim]``,
        ``action [B, L]`` (int), ``timestep [B, L]``, ``mask [B, L]`` (True on real steps)."""
        B, L = rtg.shape
        t = self.embed_t(timestep.clamp(0, self.embed_t.num_embeddings - 1))
        r = self.embed_rtg((rtg / self.rtg_scale).unsqueeze(-1)) + t
        s = self.embed_obs(obs) + t
        a = self.embed_act(action.clamp(0, self.num_actions)) + t
        x = self.ln(torch.stack([r, s, a], dim=2).reshape(B, 3 * L, -1))
        S = 3 * L
        pad = ~mask.repeat_interleave(3, dim=1)
        # causal, and no attention to padding; every token may attend to itself so that no
        # row is fully masked (padding rows would turn into NaN and leak through 0 * NaN)
        blocked = (self.causal[:S, :S][None] | pad[:, None, :]) & ~torch.eye(S, dtype=torch.bool, device=x.device)[None]
        h = self.blocks(x, mask=blocked.repeat_interleave(self.heads, dim=0))
        return self.head(h.reshape(B, L, 3, -1)[:, :, 1])

    def loss(self, batch) -> torch.Tensor:
        """Cross-entropy of the actions on real (unpadded) steps of a replay batch."""
        logits = self(batch["rtg"], batch["obs"], batch["action"], batch["timestep"], batch.mask)
        ce = nn.functional.cross_entropy(
            logits.reshape(-1, self.num_actions), batch["action"].reshape(-1), reduction="none"
        )
        m = batch.mask.reshape(-1).float()
        return (ce * m).sum() / m.sum()

    @torch.no_grad()
    def act(self, rtg, obs, action, timestep) -> int:
        """Greedy action for the last step of an unpadded history (1-D/2-D tensors, oldest first)."""
        K = self.context
        rtg, obs, action, timestep = rtg[-K:], obs[-K:], action[-K:], timestep[-K:]
        L = rtg.shape[0]
        mask = torch.ones(1, L, dtype=torch.bool)
        logits = self(rtg[None], obs[None], action[None], timestep[None], mask)
        return int(logits[0, -1].argmax())


def evaluate(
    model: DecisionTransformer, env_id: str, target_return: float, episodes: int, seed: int = 1000, max_steps: int = 500
) -> list[float]:
    """Returns of ``episodes`` greedy roll-outs conditioned on ``target_return``."""
    import gymnasium as gym
    import numpy as np

    model.eval()
    env = gym.make(env_id)
    returns = []
    for e in range(episodes):
        o, _ = env.reset(seed=seed + e)
        rtg, obs, act, ts = [target_return], [o], [model.num_actions], [0]
        total = 0.0
        for t in range(max_steps):
            a = model.act(
                torch.tensor(rtg, dtype=torch.float32),
                torch.tensor(np.array(obs), dtype=torch.float32),
                torch.tensor(act, dtype=torch.int64),
                torch.tensor(ts, dtype=torch.int64),
            )
            act[-1] = a
            o, r, term, trunc, _ = env.step(a)
            total += r
            if term or trunc:
                break
            rtg.append(rtg[-1] - r)
            obs.append(o)
            act.append(model.num_actions)
            ts.append(t + 1)
        returns.append(total)
    model.train()
    return returns
