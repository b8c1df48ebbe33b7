"""gear_flow's tables against DeepMind Reverb's, side by side on random operations: what docs/migration.md
means by "checked side by side with Reverb 0.14".

Each trial draws a table configuration (selector, priority exponent, shards, ``max_size``,
``max_times_sampled``, rate limiter) and a sequence of inserts, samples and priority updates and deletes,
and runs it on a ``gf.LocalTable`` (``--kind disk``: one on the disk tier; ``--kind distributed``: a
``gf.DistributedTable`` on an embedded ``LocalCluster``, its batches drawn by the handle from the shards'
published state or, ``--draw owners``, by the shards' owners) and on a ``reverb.Table`` in a
``reverb.Server``: one-step episodes, so an insert is one item on both.  After every operation it compares what both hold, read whole: Reverb's
items from a checkpoint of its server (their priorities and times sampled), gear_flow's from its shards'
item state.  Compared:

* which items are stored, and so which the Fifo remover evicted at ``max_size``;
* each item's priority and, with ``max_times_sampled``, its times sampled and when it expires;
* whether each insert and each sample is admitted right now (MinSize, SampleToInsertRatio, Queue, Stack),
  and the limiter's insert and sample counts;
* Fifo, Lifo, MaxHeap and MinHeap: the item a batch of 1 gets, its probability, priority, times sampled and
  table size (batches of 1: a larger ordered batch differs on purpose, docs/migration.md);
* Uniform and Prioritized: each side's reported probability against ``w_i / sum(w)`` of the state before the
  sample, and the table size.

Then, for 36 SampleToInsertRatio limiters whose ``samples_per_insert`` is no binary fraction, how many single
inserts each admits before it refuses (:func:`ratio_boundaries`).

Left out, as docs/migration.md lists them as differences on purpose: ``alpha = 0`` with items of priority 0
(weight 1 here, 0 in Reverb), ``times_sampled`` without ``max_times_sampled`` (-1 here), deletes on a Queue or
Stack (the item's room is free here).  A Reverb probability of 0 when its priorities are all 0 is its sum
tree's rounding (it tests ``total == 0`` exactly), also left out.  The distributed kind has every batch
admitted by its coordinator (``distributed.sample-lease`` 0): a batch served under an admission lease reports
the table's size when the lease was granted (docs/migration.md).

It needs Reverb: the ``bench`` extra's environment (see ``pipelines/bench_local.py``)::

    .venv-peers/bin/python pipelines/reverb_parity.py [--trials 300] [--ops 60] [--seed 0] [--out PATH]
        [--kind local|disk|distributed] [--workers 2] [--draw reader|owners]

It prints each difference found (the trial's seed, configuration and operation) and exits 1 if there was
one; the JSON records the run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from common import packages, write_json  # noqa: E402

import gear_flow as gf  # noqa: E402

ORDERED = ("fifo", "lifo", "maxheap", "minheap")
PRIORITIES = (0.0, 0.5, 1.0, 2.0, 3.0)
TIMEOUT = 0.002  # seconds a gear_flow call waits: admitted now or not


def selectors(reverb) -> dict:
    """Each selector's name to ``(gear_flow maker, Reverb maker)``, each taking the priority exponent."""
    return {
        "uniform": (lambda a: gf.Uniform(), lambda a: reverb.selectors.Uniform()),
        "prioritized": (lambda a: gf.Prioritized(alpha=a), lambda a: reverb.selectors.Prioritized(a)),
        "fifo": (lambda a: gf.Fifo(), lambda a: reverb.selectors.Fifo()),
        "lifo": (lambda a: gf.Lifo(), lambda a: reverb.selectors.Lifo()),
        "maxheap": (lambda a: gf.MaxHeap(), lambda a: reverb.selectors.MaxHeap()),
        "minheap": (lambda a: gf.MinHeap(), lambda a: reverb.selectors.MinHeap()),
    }


def limiters(reverb, kind: str, args: tuple) -> tuple:
    """``(gear_flow limiter, Reverb limiter)`` of one kind and its arguments."""
    mine, theirs = {
        "minsize": (gf.MinSize, reverb.rate_limiters.MinSize),
        "ratio": (gf.SampleToInsertRatio, reverb.rate_limiters.SampleToInsertRatio),
        "queue": (gf.Queue, reverb.rate_limiters.Queue),
        "stack": (gf.Stack, reverb.rate_limiters.Stack),
    }[kind]
    return mine(*args), theirs(*args)


def configuration(rng: random.Random) -> dict:
    """A trial's table: selector, exponent, shards, ``max_size``, ``max_times_sampled`` and limiter."""
    sel = rng.choice(("uniform", "prioritized", *ORDERED))
    max_size = rng.randint(2, 14)
    mts = rng.choice((0, 1, 2, 3)) if sel in ORDERED else 0
    r = rng.random()
    if r < 0.35:
        lim = ("minsize", (rng.randint(1, min(3, max_size)),))
    elif r < 0.85:
        spi = rng.choice((0.1, 0.5, 1.0, 2.0, 3.0))
        mins = rng.randint(1, min(3, max_size))
        width = 2 * max(1.0, spi) + rng.choice((0.0, 0.5, 1.0, 3.0))
        if rng.random() < 0.5:
            eb = width / 2
        else:
            lo = spi * mins - rng.choice((0.0, 0.5, 1.0, 2.0, 4.0, width))
            eb = (lo, lo + width)
        lim = ("ratio", (spi, mins, eb))
    elif sel in ORDERED:  # a queue or stack: its own selectors, each item sampled once
        lim = (rng.choice(("queue", "stack")), (max_size,))
        sel, mts = ("fifo" if lim[0] == "queue" else "lifo"), 1
    else:
        lim = ("minsize", (1,))
    return {"sel": sel, "alpha": rng.choice((0.0, 0.5, 1.0)), "num_shards": rng.choice((1, 1, 2, 3)),
            "max_size": max_size, "mts": mts, "lim": lim}  # fmt: skip


def operations(rng: random.Random, n: int, deletes: bool) -> list[tuple]:
    """``n`` operations: ``("insert", id, priority)``, ``("sample",)``, ``("mutate", [(id, priority)], [id])``."""
    ops, nid = [], 0
    for _ in range(n):
        r = rng.random()
        if r < 0.42:
            ops.append(("insert", nid, rng.choice(PRIORITIES)))
            nid += 1
        elif r < 0.8:
            ops.append(("sample",))
        else:
            ups = [(rng.randrange(max(nid, 1)), rng.choice(PRIORITIES)) for _ in range(rng.choice((0, 1, 1, 2, 3)))]
            dels = [rng.randrange(max(nid, 1)) for _ in range(rng.choice((0, 0, 0, 1)))] if deletes else []
            ops.append(("mutate", ups, dels))
    return ops


def _checkpoint_items(path: str, schema) -> list:
    """The ``PrioritizedItem``s of a Reverb checkpoint (``items.tfrecord``: a ZLIB-compressed TFRecord)."""
    raw = zlib.decompress(Path(path, "items.tfrecord").read_bytes())
    i, out = 0, []
    while i < len(raw):
        (n,) = struct.unpack("<Q", raw[i : i + 8])
        item = schema.PrioritizedItem()
        item.ParseFromString(raw[i + 12 : i + 12 + n])  # (after the length and its checksum)
        out.append(item)
        i += 12 + n + 4  # (and the data's checksum)
    return out


def _items(shards) -> dict:
    """``{id: (priority, times sampled or None)}`` of the live items of ``shards``, from their item state."""
    out = {}
    for s in shards:
        with s.lock:
            slots = np.flatnonzero(s.active)
            for slot, i in zip(slots, s.ring.columns["x"][slots]):
                n = None if s.times_sampled is None else int(s.times_sampled[slot])
                out[int(i)] = (float(s.priority[slot]), n)
    return out


def _items_here(name: str, dask_worker=None) -> dict:
    """:func:`_items` of this worker's shards of table ``name`` (``client.run``)."""
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    return _items(t.shards.values() if t is not None else ())


class Kind:
    """gear_flow's side of the pairs: ``local`` (a ``gf.LocalTable``), ``disk`` (one on the disk tier, in a
    directory of its own) or ``distributed`` (a ``gf.DistributedTable`` on ``client``'s cluster); one table
    at a time."""

    def __init__(self, name: str, client=None):
        self.name, self.client, self.path = name, client, None

    def table(self, spec, kw: dict):
        """A new table of this kind."""
        if self.name == "distributed":
            return gf.DistributedTable.create(self.client, spec, **kw)
        if self.name == "disk":
            self.path = tempfile.mkdtemp(prefix="reverb-parity-disk-")
            shutil.rmtree(self.path)  # (a disk table makes its directory; its close keeps it)
            return gf.LocalTable(spec, tier="disk", path=self.path, **kw)
        return gf.LocalTable(spec, **kw)

    def items(self, table) -> dict:
        """:func:`_items` of ``table``'s shards, read where they are."""
        if self.client is None:
            return _items(table.shards)
        return {i: v for per in self.client.run(_items_here, table.name).values() for i, v in per.items()}

    def close(self, table) -> None:
        """Close ``table`` (a disk table's directory removed)."""
        table.close()
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


class Pair:
    """One configuration on both: a gear_flow table of ``kind`` (default local) and a ``reverb.Table`` served by
    a ``reverb.Server`` that checkpoints into ``tmp``; items carry their id as their one column."""

    def __init__(self, reverb, cfg: dict, tmp: str, kind: Kind | None = None):
        from reverb.cc import schema_pb2

        self.reverb, self.schema, self.cfg = reverb, schema_pb2, cfg
        sel, lim = selectors(reverb), limiters(reverb, *cfg["lim"])
        remover = "lifo" if cfg["lim"][0] == "stack" else "fifo"
        spec = gf.TableSpec((gf.ColumnSpec("x", (), np.int64),), capacity=256, num_shards=cfg["num_shards"],
                            max_size=cfg["max_size"])  # fmt: skip
        kw = dict(sampler=sel[cfg["sel"]][0](cfg["alpha"]), remover=sel[remover][0](1.0), rate_limiter=lim[0],
                  max_times_sampled=cfg["mts"], seed=0)  # fmt: skip
        self.kind = kind or Kind("local")
        self.g = self.kind.table(spec, kw)
        self.rt = reverb.Table("t", sampler=sel[cfg["sel"]][1](cfg["alpha"]), remover=sel[remover][1](1.0),
                               max_size=cfg["max_size"], rate_limiter=lim[1], max_times_sampled=cfg["mts"])  # fmt: skip
        self.server = reverb.Server([self.rt], port=None, checkpointer=reverb.checkpointers.DefaultCheckpointer(tmp))
        self.client = reverb.Client(f"localhost:{self.server.port}")
        self.gkey, self.rkey, self.rid = {}, {}, {}  # id -> our key, id -> Reverb's key, Reverb's key -> id
        self.pending = None  # the id of Reverb's last insert, its key learnt at the next state read

    def close(self) -> None:
        """Stop the server, close the table."""
        self.server.stop()
        self.kind.close(self.g)

    def reverb_state(self) -> dict:
        """Reverb's items: ``{id: (priority, times sampled)}``."""
        path = self.client.checkpoint()
        items = _checkpoint_items(path, self.schema)
        shutil.rmtree(path, ignore_errors=True)
        new = [it for it in items if it.key not in self.rid]
        if new:  # (one insert at most since the last read)
            self.rid[new[0].key], self.rkey[self.pending] = self.pending, new[0].key
        self.pending = None
        return {self.rid[it.key]: (float(it.priority), int(it.times_sampled)) for it in items}

    def our_state(self) -> dict:
        """gear_flow's items, from its shards' item state (in the workers for a distributed table):
        ``{id: (priority, times sampled or None)}``."""
        return self.kind.items(self.g)

    def insert(self, i: int, p: float) -> tuple[bool, bool]:
        """Item ``i`` of priority ``p`` into both where admitted now: ``(ours admitted, Reverb's)``."""
        try:
            self.gkey[i] = int(self.g.insert({"x": np.array([i])}, priorities=p, timeout=TIMEOUT).first_keys[0])
            ours = True
        except gf.RateLimitTimeout:
            ours = False
        theirs = bool(self.rt.can_insert(1))
        if theirs:
            self.client.insert(np.int64(i), {"t": p})
            self.pending = i
        return ours, theirs

    def sample(self) -> tuple:
        """A batch of 1 from both where admitted now: each ``(id, probability, times sampled, table size,
        priority)`` or None."""
        try:
            b = self.g.sample(1, timeout=TIMEOUT)
            ours = (int(b["x"].numpy()[0, 0]), float(b.probabilities[0]), int(b.times_sampled[0]),
                    int(b.table_size), float(b.priorities[0]))  # fmt: skip
        except gf.RateLimitTimeout:
            ours = None
        theirs = None
        if self.rt.can_sample(1):
            (s,) = list(self.client.sample("t", 1))
            s = s[0] if isinstance(s, list) else s
            info = {k: np.asarray(getattr(s.info, k)).reshape(-1)[0] for k in s.info._fields}
            theirs = (int(np.asarray(s.data[0]).reshape(-1)[0]), float(info["probability"]),
                      int(info["times_sampled"]), int(info["table_size"]), float(info["priority"]))  # fmt: skip
        return ours, theirs

    def mutate(self, updates: list, deletes: list) -> None:
        """Priority updates ``[(id, priority)]`` (the last of an id's wins, as Reverb's dict keeps it) and
        deletes ``[id]`` of the items both sides inserted."""
        ups = dict((i, p) for i, p in updates if i in self.gkey and i in self.rkey)
        dels = [i for i in deletes if i in self.gkey and i in self.rkey]
        if ups:
            self.g.update_priorities([self.gkey[i] for i in ups], list(ups.values()))
        if dels:
            self.g.delete([self.gkey[i] for i in dels])
        self.client.mutate_priorities("t", updates={self.rkey[i]: p for i, p in ups.items()},
                                      deletes=[self.rkey[i] for i in dels])  # fmt: skip


def chance(state: dict, i: int, cfg: dict, reverb: bool) -> float:
    """Item ``i``'s probability in ``state``: ``w_i / sum(w)``, uniform over all when no weight is left (a
    weight ``p ** alpha``; with ``alpha = 0`` 1 here, and 0 for priority 0 in Reverb)."""
    if cfg["sel"] == "uniform":
        return 1 / len(state)
    a = cfg["alpha"]
    w = {k: (0.0 if reverb and p == 0 else 1.0 if a == 0 else p**a) for k, (p, _) in state.items()}
    total = sum(w.values())
    return w[i] / total if total else 1 / len(state)


def difference(pair: Pair, op: tuple, before: dict) -> str | None:
    """Run ``op`` on both; what differs after it (None: nothing)."""
    cfg = pair.cfg
    if op[0] == "insert":
        ours, theirs = pair.insert(op[1], op[2])
        if ours != theirs:
            return f"insert admitted: ours {ours}, Reverb's {theirs}"
    elif op[0] == "sample":
        ours, theirs = pair.sample()
        if (ours is None) != (theirs is None):
            return f"sample admitted: ours {ours}, Reverb's {theirs}"
        if ours is not None and cfg["sel"] in ORDERED:
            if cfg["mts"] == 0:  # (not counted here without max_times_sampled: docs/migration.md)
                ours = (*ours[:2], theirs[2], *ours[3:])
            if ours != theirs:
                return f"sample: ours {ours}, Reverb's {theirs}"
        elif ours is not None:
            want, want_r = chance(before, ours[0], cfg, False), chance(before, theirs[0], cfg, True)
            rounding = theirs[1] == 0.0 and all(p == 0 for p, _ in before.values())  # (Reverb's sum tree)
            if abs(ours[1] - want) > 1e-9 * want or (abs(theirs[1] - want_r) > 1e-6 * want_r and not rounding):
                return f"probability: ours {ours} (want {want}), Reverb's {theirs} (want {want_r})"
            if ours[3] != theirs[3] or ours[4] != before[ours[0]][0] or theirs[4] != before[theirs[0]][0]:
                return f"table size or priority: ours {ours}, Reverb's {theirs}"
    else:
        pair.mutate(op[1], op[2])
    theirs, ours = pair.reverb_state(), pair.our_state()
    if set(theirs) != set(ours):
        return f"items stored: ours {sorted(ours)}, Reverb's {sorted(theirs)}"
    for i, (p, n) in theirs.items():
        if ours[i][0] != p or (ours[i][1] is not None and ours[i][1] != n):
            return f"item {i}: ours (priority, times sampled) {ours[i]}, Reverb's {(p, n)}"
    info = pair.g.info()["rate_limiter"]
    rl = pair.client.server_info()["t"]
    ri = (rl.rate_limiter_info.insert_stats.completed, rl.rate_limiter_info.sample_stats.completed, rl.current_size)
    if (info["inserts"], info["samples"], pair.g.size) != ri:
        return (
            f"limiter (inserts, samples, size): ours {(info['inserts'], info['samples'], pair.g.size)}, Reverb's {ri}"
        )
    return None


def trial(reverb, seed: int, n_ops: int, tmp: str, kind: Kind | None = None) -> dict | None:
    """One random trial (on gear_flow's table ``kind``, default local); the first difference (seed,
    configuration, operation, what) or None."""
    rng = random.Random(seed)
    cfg = configuration(rng)
    ops = operations(rng, n_ops, deletes=cfg["lim"][0] not in ("queue", "stack"))
    pair = Pair(reverb, cfg, os.path.join(tmp, str(seed)), kind)  # (a server loads what its directory holds)
    try:
        for k, op in enumerate(ops):
            what = difference(pair, op, pair.our_state())
            if what is not None:
                return {"seed": seed, "config": cfg, "at": k, "op": list(op), "difference": what}
        return None
    finally:
        pair.close()


def ratio_boundaries(reverb, kind: Kind | None = None) -> list[dict]:
    """SampleToInsertRatio limiters whose ``samples_per_insert`` is no binary fraction (0.1, 0.3, 0.7), each
    filled one insert at a time until it refuses, on both: the inserts each admits (where the last insert's
    rounding decides).  A random trial seldom lands on such a boundary; these do."""
    out = []
    for spi in (0.1, 0.3, 0.7):
        for mins in (1, 2, 3):
            for eb in (1.3, 1.7, 2.2, 5.0):
                cfg = {"sel": "uniform", "alpha": 1.0, "num_shards": 1, "max_size": 1000, "mts": 0,
                       "lim": ("ratio", (spi, mins, eb))}  # fmt: skip
                n = [0, 0]
                with tempfile.TemporaryDirectory(prefix="reverb-parity-") as tmp:
                    pair = Pair(reverb, cfg, tmp, kind)
                    try:
                        for i in range(2000):
                            ours, theirs = pair.insert(i, 1.0)
                            n[0], n[1] = n[0] + ours, n[1] + theirs
                            pair.reverb_state()  # (its key learnt)
                            if not (ours or theirs):
                                break
                    finally:
                        pair.close()
                if n[0] != n[1]:
                    out.append({"config": cfg, "difference": f"inserts admitted: ours {n[0]}, Reverb's {n[1]}"})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--ops", type=int, default=60, help="operations per trial")
    p.add_argument("--seed", type=int, default=0, help="the first trial's seed (then one up per trial)")
    p.add_argument("--kind", choices=("local", "disk", "distributed"), default="local",
                   help="gear_flow's LocalTable, one on the disk tier, or a DistributedTable on an embedded "
                   "LocalCluster")  # fmt: skip
    p.add_argument("--workers", type=int, default=2, help="the distributed kind's worker processes")
    p.add_argument("--draw", choices=("reader", "owners"), default="reader",
                   help="the distributed kind's draws: by the handle from the shards' published state where it "
                   "can, or every batch by the shards' owners")  # fmt: skip
    p.add_argument(
        "--out",
        default=None,
        help="JSON path (default benchmarks/results/reverb_parity[_disk|_distributed[_owners]].json)",
    )
    args = p.parse_args(argv)
    import reverb
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)
    with contextlib.ExitStack() as stack:
        client = None
        if args.kind == "distributed":
            import dask
            from dask.distributed import Client, LocalCluster

            # every batch admitted by the coordinator: one served under an admission lease reports the
            # table's size when the lease was granted (docs/migration.md), not Reverb's size at the draw
            stack.enter_context(dask.config.set({"gear-flow.distributed.sample-lease": 0,
                                                 "gear-flow.distributed.reader-draw": args.draw == "reader"}))  # fmt: skip

            cluster = stack.enter_context(LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                                       host="127.0.0.1", dashboard_address=None))  # fmt: skip
            client = stack.enter_context(Client(cluster))
        return _run(reverb, args, Kind(args.kind, client))


def _run(reverb, args, kind: Kind) -> int:
    """:func:`main`'s trials and boundaries on gear_flow's tables of ``kind``; writes the JSON."""
    found, t0 = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="reverb-parity-") as tmp:
        for seed in range(args.seed, args.seed + args.trials):
            d = trial(reverb, seed, args.ops, tmp, kind)
            if d is not None:
                found.append(d)
                print(d, flush=True)
    bounds = ratio_boundaries(reverb, kind)
    for d in bounds:
        print(d, flush=True)
    print(
        f"{args.trials} trials of {args.ops} operations: {len(found)} with a difference; "
        f"SampleToInsertRatio boundaries: {len(bounds)} of 36 differ"
    )
    write_json(
        "reverb_parity"
        + {"local": "", "disk": "_disk", "distributed": f"_distributed{'_owners' * (args.draw == 'owners')}"}[
            kind.name
        ],
        {
            "args": vars(args),
            "packages": packages(("dm-reverb", "numpy")),
            "seconds": time.perf_counter() - t0,
            "trials": args.trials,
            "operations": args.trials * args.ops,
            "differences": found,
            "ratio_boundaries": 36,
            "boundary_differences": bounds,
        },
        args.out,
    )
    return 1 if found or bounds else 0


if __name__ == "__main__":
    sys.exit(main())
