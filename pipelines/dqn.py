"""Double DQN with n-step returns from replay windows (the model side of ``online_dqn.py``).

Episode layout in the table (dm_env's convention): an episode of ``T``
transitions is stored as ``T + 1`` rows.  Row ``t < T`` holds the observation
``s_t``, the action ``a_t`` taken there, the reward ``r_t`` it earned and
whether the environment ``terminated`` or ``truncated`` right after it; row
``T`` holds the final observation ``s_T`` (action and reward 0) and starts no
transition.  A window of ``n + 1`` rows sampled with ``boundary="pad_tail"``
from item ``t`` therefore holds everything an n-step target needs:

* ``m = mask[1:].sum()`` transitions are available (``m < n`` near the
  episode end, ``m == 0`` for the final row's own item, which is no transition);
* the return ``G = sum_{k<m} gamma^k r_{t+k}``;
* the bootstrap state is row ``m`` (always a stored row, never padding),
  discounted by ``gamma^m`` and dropped when the last transition terminated —
  a time-limit truncation still bootstraps from the final observation.

Actors run the policy with :func:`numpy_q` on plain NumPy weights (no torch on
the workers); the learner trains the torch network.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

COLUMNS = ("obs", "action", "reward", "terminated", "truncated")


def columns(obs_dim: int):
    """The table's columns for an environment with ``obs_dim``-dimensional observations."""
    from gear_flow import ColumnSpec

    return (
        ColumnSpec("obs", (obs_dim,), np.float32),
        ColumnSpec("action", (), np.int64),
        ColumnSpec("reward", (), np.float32),
        ColumnSpec("terminated", (), np.bool_),
        ColumnSpec("truncated", (), np.bool_),
    )


def q_network(obs_dim: int, num_actions: int, hidden=(128, 128)) -> nn.Sequential:
    """An MLP ``obs -> Q(obs, .)`` (ReLU hidden layers)."""
    layers, d = [], obs_dim
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU()]
        d = h
    layers.append(nn.Linear(d, num_actions))
    return nn.Sequential(*layers)


def numpy_params(model: nn.Sequential) -> list[np.ndarray]:
    """Copies of the weights as ``[W_1^T, b_1, W_2^T, b_2, ...]`` float32 arrays, for :func:`numpy_q`."""
    out = []
    for m in model:
        if isinstance(m, nn.Linear):
            out += [m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy()]
    return out


def numpy_q(params: list[np.ndarray], obs: np.ndarray) -> np.ndarray:
    """Q-values of ``obs`` (``[obs_dim]`` or ``[N, obs_dim]``) under :func:`numpy_params` weights."""
    x = np.asarray(obs, dtype=np.float32)
    last = len(params) // 2 - 1
    for i in range(0, len(params), 2):
        x = x @ params[i] + params[i + 1]
        if i // 2 < last:
            np.maximum(x, 0.0, out=x)
    return x


def n_step_targets(batch, n: int, gamma: float):
    """Split a batch of ``n + 1``-row windows into what an n-step TD target needs.

    Returns
    -------
    obs, action : Tensor
        ``s_t`` ``[B, obs_dim]`` and ``a_t`` ``[B]``.
    ret : Tensor
        float32 ``[B]``: discounted sum of the ``m`` available rewards.
    boot_obs : Tensor
        ``[B, obs_dim]``: the state ``s_{t+m}`` to bootstrap from.
    boot_discount : Tensor
        float32 ``[B]``: ``gamma^m``, 0 when the episode terminated inside the
        window or when the item is no transition.
    valid : Tensor
        bool ``[B]``: the item starts a transition (``m >= 1``).
    """
    obs = batch["obs"]
    B = obs.shape[0]
    if batch.length != n + 1:
        raise ValueError(f"windows of length {batch.length} given for n={n}: need n + 1 = {n + 1}")
    have = batch.mask[:, 1:]  # transition k exists iff row k + 1 is stored
    m = have.sum(1)
    valid = m > 0
    disc = gamma ** torch.arange(n, dtype=torch.float32)
    ret = (batch["reward"][:, :n].float() * have * disc).sum(1)
    rows = torch.arange(B)
    last = (m - 1).clamp(min=0)
    terminated = batch["terminated"][rows, last]
    boot_discount = torch.pow(torch.tensor(gamma, dtype=torch.float32), m.float()) * (~terminated & valid)
    return obs[:, 0], batch["action"][:, 0], ret, obs[rows, m], boot_discount, valid


def importance_weights(probabilities: torch.Tensor, beta: float, valid: torch.Tensor) -> torch.Tensor:
    """``P_i^-beta`` over the batch maximum (among valid items), computed here so that beta can anneal."""
    p = probabilities.double().clamp(min=1e-300)
    w = p.pow(-beta) * valid
    return (w / w.max().clamp(min=1e-300)).float()


def dqn_loss(online: nn.Module, target: nn.Module, batch, n: int, gamma: float, beta: float):
    """Double-DQN n-step Huber loss, importance weighted.

    Returns ``(loss, td, valid)``: ``td`` (detached, float32 ``[B]``) is 0 for
    items that are no transition; use ``|td| + eps`` as new priorities there
    and 0 for invalid ones.
    """
    obs, action, ret, boot_obs, boot_discount, valid = n_step_targets(batch, n, gamma)
    q = online(obs).gather(1, action.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        a_star = online(boot_obs).argmax(1, keepdim=True)
        y = ret + boot_discount * target(boot_obs).gather(1, a_star).squeeze(1)
    td = q - y
    w = importance_weights(batch.probabilities, beta, valid)
    per = nn.functional.smooth_l1_loss(q, y, reduction="none")
    loss = (w * per).sum() / valid.sum().clamp(min=1)
    return loss, (td.detach() * valid), valid


def run_episodes(policy, env_id: str, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` roll-outs of ``policy(obs, rng) -> action``."""
    import gymnasium as gym

    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    out = []
    for e in range(episodes):
        o, _ = env.reset(seed=seed + e)
        total, done = 0.0, False
        while not done:
            o, r, term, trunc, _ = env.step(policy(o, rng))
            total += float(r)
            done = term or trunc
        out.append(total)
    env.close()
    return out


def greedy(params: list[np.ndarray]):
    """The greedy policy of :func:`numpy_params` weights."""
    return lambda o, rng: int(np.argmax(numpy_q(params, o)))


def uniform_random(num_actions: int):
    """The uniformly random policy (the baseline)."""
    return lambda o, rng: int(rng.integers(num_actions))
