import numpy as np

import gear_flow as gf

spec = gf.TableSpec(
    columns=(
        gf.ColumnSpec("obs", (8,), np.float32),
        gf.ColumnSpec("action", (), np.int64),
        gf.ColumnSpec("reward", (), np.float32),
        gf.ColumnSpec("done", (), np.bool_),
    ),
    capacity=100_000,  # steps per shard
    num_shards=2,
)
table = gf.LocalTable(
    spec,
    sampler=gf.Prioritized(alpha=0.6, beta=0.4),
    remover=gf.Fifo(),
    rate_limiter=gf.SampleToInsertRatio(samples_per_insert=4, min_size_to_sample=1_000, error_buffer=50_000),
)
rng = np.random.default_rng(0)
episodes = [  # dicts of [T, ...] arrays, one per episode
    {
        "obs": rng.standard_normal((T, 8), dtype=np.float32),
        "action": rng.integers(0, 4, T),
        "reward": rng.standard_normal(T, dtype=np.float32),
        "done": np.arange(T) == T - 1,
    }
    for T in rng.integers(50, 200, 20)
]
table.insert(episodes)  # all or nothing
with table.writer() as w:  # or stream steps from an actor
    for t in range(100):
        w.append({"obs": np.zeros(8, np.float32), "action": 0, "reward": 1.0, "done": t == 99})
    w.end_episode()  # the episode becomes sampleable here

batch = table.sample(batch_size=256, length=16)  # strict windows inside one episode
print(batch["obs"].shape, batch.mask.shape)  # torch.Size([256, 16, 8]) torch.Size([256, 16])
print(batch.probabilities[:3], batch.weights[:3])  # each draw's probability, importance weights
table.update_priorities(batch.keys, rng.random(256) + 0.1)
