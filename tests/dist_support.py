"""Running the table suites against :class:`DistributedTable` too: a factory and state snapshots.

The distributed snapshot reads the real shards inside the worker processes
(``client.run``) and the coordinator's counters, so "nothing changed" is
checked on what the workers hold, not on what the client believes.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from helpers import shard_state

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.distributed.plugin import PLUGIN_NAME
from gear_flow.distributed.transport import Context, CoordinatorClient

#: for the clusters whose worker is killed or closes: each call that still dials its address retries until Dask's
#: connect timeout runs out, where a live worker on loopback accepts within milliseconds
DIAL = {"distributed.comm.timeouts.connect": "2s"}


_CONTEXTS: dict = {}


def context(t) -> Context:
    """A transport :class:`Context` of the tests' own on table ``t``'s client (one per client: the one
    :func:`coordinator` uses), for requests the handle does not make, e.g. ``call(context(t), addr, op, ...)``
    on ``t.client``'s event loop.

    It is not the handle's: it has no placement version (a request to a worker goes without ``epoch`` unless
    it names one) and learns no worker's lane (requests to workers take the comm); the coordinator's lane it
    looks for once, on its first coordinator request.
    """
    ctx = _CONTEXTS.get(id(t.client))
    if ctx is None or ctx.client is not t.client:
        ctx = _CONTEXTS[id(t.client)] = Context(client=t.client)
    return ctx


def coordinator(t, blocking: bool = True) -> CoordinatorClient:
    """The coordinator's operations about table ``t`` through ``t``'s client, as a caller of its own (on
    :func:`context`, so its lane is looked for once per client): answered in this thread, or awaitables on
    the client's event loop."""
    return CoordinatorClient(context(t), t.name, blocking)


def handed(
    t_or_name, client=None, worker: bool = False, seed: int | None = None, timeout: float | None = None
) -> tuple[DistributedTable, Context]:
    """A handle on table ``t_or_name`` (a handle or the table's name) and the transport :class:`Context` it is
    handed, which the test holds: the handle's seam (``DistributedTable(ctx, name, state, ...)``), built as
    :func:`gear_flow.distributed.construction.attach` builds it, so a test reads or breaks that handle's lanes
    (``ctx.lanes``, ``ctx.coord_lane()``) on its own object, not through the handle's private attributes.

    The context is from ``client`` (default: ``t_or_name``'s client) or, with ``worker=True``, from the worker
    running the current task (``distributed.get_worker()``); the table's state is the coordinator's lookup
    over it (its first coordinator request: the coordinator's lane is looked for there, under the dask config
    in force).  The handle is attached, not the table's creator: the test closes the table as before.
    """
    name = t_or_name if isinstance(t_or_name, str) else t_or_name.name
    if worker:
        from distributed import get_worker

        ctx = Context(worker=get_worker())
    else:
        ctx = Context(client=client if client is not None else t_or_name.client)

    async def look():
        return await CoordinatorClient(ctx, name).lookup()

    return DistributedTable(ctx, name, ctx.sync(look), seed=seed, timeout=timeout), ctx


@contextlib.contextmanager
def own_cluster(cfg: dict | None = None, n: int = 2, **kw):
    """A cluster of the test's own (it closes or kills one of the workers): ``n`` worker processes on
    127.0.0.1, a 5 s connect timeout (a dead worker is given up on soon), ``cfg`` set, ``kw`` more
    ``LocalCluster`` arguments.

    Once it is closed, what its first workers left behind goes (``sweep`` of their pids).  A killed
    worker leaves its shared segments and lane directory, as after a crash, and its nanny's
    replacement sweeps them when it starts; the cluster can close before that replacement starts,
    and the suite's check for leftovers at its end should not depend on some later test starting a
    worker."""
    from gear_flow.storage.shared import sweep

    pids: list[int] = []
    try:
        with (
            dask.config.set({"distributed.comm.timeouts.connect": "5s", **(cfg or {})}),
            LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None, **kw
            ) as cluster,
            Client(cluster) as client,
        ):
            pids.extend(client.run(os.getpid).values())
            yield client
    finally:
        sweep(pids)


def wait_for(pred, what, deadline=60.0):
    """Poll ``pred`` (a state another process or thread reaches) until it holds, or fail after ``deadline`` s."""
    end = time.monotonic() + deadline
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling a condition, not a barrier


def kill(pid: int) -> None:
    """SIGKILL ``pid`` and wait until it has exited: a reader drawing from its published state (still
    mapped) sees it dead from then on, as a request to it would."""
    import os
    import select
    import signal

    # /proc shows a thread-group leader as a zombie while its other threads are still exiting; the
    # pidfd (what a reader's owner_alive polls) turns readable only once the whole process has gone
    fd = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: bool(select.select([fd], [], [], 0.05)[0]), f"process {pid} to exit")
    finally:
        os.close(fd)


def tables_here(dask_worker=None) -> list[str]:
    """Names of the tables this worker holds shards of (``client.run``)."""
    return sorted(dask_worker.plugins[PLUGIN_NAME].host.tables)


class TableFactory:
    """Makes the suite's tables: ``local``, ``distributed`` (the handle draws from its host's published
    selection state where it can) or ``owner-draw`` (the shards' owners draw every batch; a table whose
    owners draw anyway -- not Uniform or Prioritized, or with ``max_times_sampled`` -- is the distributed
    kind's case already, and skips unless ``skip_same`` is False)."""

    def __init__(self, kind: str, client=None, skip_same: bool = True, tmp=None):
        self.kind = kind
        self.client = client
        self.skip_same = skip_same
        self.current = None
        self.tmp = tmp
        self.made = 0

    def __call__(self, spec, **kw):
        if self.kind == "local":
            return gf.LocalTable(spec, **kw)
        if self.kind == "disk":  # a new directory per table (hypothesis makes one per example)
            self.made += 1
            return gf.LocalTable(spec, tier="disk", path=self.tmp / f"table-{self.made}", **kw)
        self.close()
        owner = self.kind == "owner-draw"
        if owner and self.skip_same and not (isinstance(kw.get("sampler", gf.Uniform()), (gf.Uniform, gf.Prioritized))
                          and not kw.get("max_times_sampled")):  # fmt: skip
            pytest.skip("its owners draw every batch on the distributed kind too")
        with dask.config.set({"gear-flow.distributed.reader-draw": not owner}):
            self.current = DistributedTable.create(self.client, spec, **kw)
        return self.current

    def queue(self, spec, size, **kw):
        spec = gf.TableSpec(spec.columns, spec.capacity, spec.num_shards, spec.item_unit, size)
        kw = dict(sampler=gf.Fifo(), remover=gf.Fifo(), rate_limiter=gf.Queue(size), max_times_sampled=1, **kw)
        return self(spec, **kw)

    def close(self):
        if self.current is not None:
            self.current.close()
            self.current = None


def _worker_shards(name, dask_worker=None):
    host = dask_worker.plugins["gear-flow"].host
    t = host.tables.get(name)
    if t is None:
        return []
    out = []
    for i, s in sorted(t.shards.items()):
        with s.lock:
            out.append((i, *shard_state(s), s.counters.as_dict()))
    return out


def active_items(t) -> int:
    """Live items counted from the shards' own state (in the workers for a distributed table)."""
    if isinstance(t, DistributedTable):
        res = t.client.run(_worker_shards, t.name)
        return sum(int(x[3].sum()) for parts in res.values() for x in parts)
    return sum(int(s.active.sum()) for s in t.shards)


def snapshot(t):
    """Everything an applied call could change: shards (in their processes) and the global counters."""
    if not isinstance(t, DistributedTable):
        from test_bad_input import snapshot as local_snapshot

        return ("local", local_snapshot(t))
    t.flush()
    res = t.client.run(_worker_shards, t.name)
    shards = sorted((x for parts in res.values() for x in parts), key=lambda x: x[0])
    st = coordinator(t).lookup()
    # episode ids and stamps are never reused, so an aborted insert consumes them; what it must not leave
    # behind is in the sizes, the limiter's counts and the shards themselves
    glob = {k: st[k] for k in ("size", "admitted", "shard_size", "rate_limiter", "lost", "inserts_in_flight")}
    return ("distributed", (copy.deepcopy(glob), shards))


def assert_same(a, b):
    assert a[0] == b[0]
    if a[0] == "local":
        from test_bad_input import assert_same as local_same

        return local_same(a[1], b[1])
    (ga, sa), (gb, sb) = a[1], b[1]
    assert ga == gb
    assert len(sa) == len(sb)
    for x, y in zip(sa, sb):
        assert x[0] == y[0] and x[1] == y[1] and x[7] == y[7] and x[8] == y[8] and x[9] == y[9]
        for k in x[2]:
            assert np.array_equal(x[2][k].view(np.uint8), y[2][k].view(np.uint8))
        for i in (3, 4, 5, 6):
            if x[i] is None:
                assert y[i] is None
            else:
                assert np.array_equal(x[i], y[i])


def on_both_tables(local_settings, dist_settings, **strategies):
    """Turn ``body(make_table, **drawn)`` into two hypothesis tests: local and distributed.

    The distributed variant runs fewer examples (each builds a table on the
    cluster and every call is a round trip); both draw from the same strategies,
    and each distributed example also draws who draws its batches: the handle
    from the shards' published state, or their owners.
    Returns ``(test_local, test_distributed)``.
    """
    from hypothesis import given
    from hypothesis import strategies as st

    def deco(body):
        @local_settings
        @given(**strategies)
        def test_local(**drawn):
            body(gf.LocalTable, **drawn)

        @dist_settings
        @given(owner_draw=st.booleans(), **strategies)
        def test_distributed(dist_client, owner_draw, **drawn):
            f = TableFactory("owner-draw" if owner_draw else "distributed", dist_client, skip_same=False)
            try:
                body(f, **drawn)
            finally:
                f.close()

        test_local.__doc__ = test_distributed.__doc__ = body.__doc__
        return test_local, test_distributed

    return deco


# -- what the workers received: insert requests counted on each worker's comm handler and lane ----------
#: insert operations that carry episodes
DATA_OPS = ("stage", "write")


def _count_requests(dask_worker=None):
    """Wrap this worker's ``gear_flow`` handler and its lane's server: count the requests with episodes."""
    from gear_flow.distributed.wire import array_bytes

    plugin = dask_worker.plugins[PLUGIN_NAME]
    counts = {path: {op: 0 for op in (*DATA_OPS, "bytes")} for path in ("comm", "lane")}
    plugin.request_counts = counts

    async def counting(comm=None, action=None, args=None, v=None, packed=None, frames=None):
        if action in DATA_OPS:
            counts["comm"][action] += 1
            counts["comm"]["bytes"] += len(packed or b"") + sum(getattr(f, "nbytes", 0) for f in frames or [])
        return await plugin.handle(comm=comm, action=action, args=args, v=v, packed=packed, frames=frames)

    async def lane_counting(action, args, v):
        if action in DATA_OPS:
            counts["lane"][action] += 1
            counts["lane"]["bytes"] += array_bytes(args)
        return await plugin.serve(action, args, v)

    dask_worker.handlers["gear_flow"] = counting
    plugin.lane._serve = lane_counting


def _requests(dask_worker=None):
    return {k: dict(v) for k, v in dask_worker.plugins[PLUGIN_NAME].request_counts.items()}


def restore_requests(dask_worker=None):
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    if plugin is not None and hasattr(plugin, "request_counts"):
        dask_worker.handlers["gear_flow"] = plugin.handle
        plugin.lane._serve = plugin.serve
        del plugin.request_counts


class RequestCounts:
    """Counts, on every worker, the insert requests with episodes that arrive over the comm and the lane."""

    def __init__(self, client):
        self.client = client

    def start(self):
        """Install the counters (after a table exists: its creation sets up the workers' plugin)."""
        self.client.run(_count_requests)

    def seen(self) -> dict:
        """``{worker: {"comm" | "lane": {op: requests, "bytes": n}}}`` since :meth:`start`."""
        return self.client.run(_requests)
