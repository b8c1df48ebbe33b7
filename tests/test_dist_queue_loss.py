"""A queue never drops an item that waits, not even one a sample was counted for and then gave back.

A queue's sample is counted out of the limiter when it is granted, so an
insert admitted while the sample holds the queue may take the room of the
items the sample is about to expire: the queue holds ``size`` plus the batch
until the sample finishes, and the insert's eviction to ``max_size`` waits
for it.  When the sample does not finish but gives its admission back (its
shard's worker lost, a worker's refusal), the items it was counted for still
wait; they must be handed out later, in order, not evicted as the excess over
``max_size`` (the oldest: exactly those).  The windows are held open with a
worker-side hold of one request (events, no sleeps).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal

import numpy as np
import pytest
from dist_support import DIAL, coordinator, own_cluster, wait_for

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.distributed.plugin import PLUGIN_NAME

pytestmark = pytest.mark.timeout(240)

TAG = (gf.ColumnSpec("tag", (), np.int64),)


def tagged(tags):
    return [{"tag": np.array([t], np.int64)} for t in tags]


def _hold_first(op, refuse, dask_worker=None):
    """This worker's next ``op`` request (over its lane or its comm) waits until :func:`_release_held`, then
    is served, or with ``refuse`` answered with an error; its other requests are served meanwhile."""
    from gear_flow.errors import SpecError

    plugin = dask_worker.plugins[PLUGIN_NAME]
    plugin.held = held = {"waiting": False, "go": asyncio.Event()}

    def wrapped(real):
        async def serve(action, *args):
            if action == op and not held["waiting"]:
                held["waiting"] = True
                await held["go"].wait()
                if refuse:
                    return False, SpecError(f"{op} refused (injected)")
            return await real(action, *args)

        return serve

    plugin.lane._serve, plugin.serve = wrapped(plugin.lane._serve), wrapped(plugin.serve)


def _held_waiting(dask_worker=None):
    return dask_worker.plugins[PLUGIN_NAME].held["waiting"]


def _release_held(dask_worker=None):
    dask_worker.plugins[PLUGIN_NAME].held["go"].set()


async def _kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def _insert_in_task(name, tags):
    """A task (an actor): insert ``tags`` into this worker's shard 0, in its own thread; the shards, and
    whether it was served in the thread."""
    t = DistributedTable.attach(name)
    r = t.insert(tagged(tags), shard=0)
    return r.shards.tolist(), t.stats["insert_in_thread"]


@pytest.mark.parametrize("writer", ["client", "actor"])
@pytest.mark.parametrize("given_back", ["worker lost", "refused"])
def test_a_queue_sample_given_back_leaves_its_items_to_be_handed_out_in_order(given_back, writer):
    """A full queue of 4 holds items 1-4 on shard 0.  A sample of 2 is granted and asks both workers for
    candidates; shard 1's worker holds that request.  Meanwhile an insert of 5 and 6 is admitted (the
    sample was counted out) and committed: 6 items wait, two over ``max_size`` until the sample expires
    its two.  Then shard 1's worker is SIGKILLed (the sample gives its admission back and is admitted
    again, degraded) or refuses the request (the sample fails and gives it back).  Nothing is evicted:
    the next samples hand out 1 to 6 in order, each once, and the sizes and counts agree.  The insert
    comes from a client, or from a task on shard 0's worker (in its thread)."""
    with own_cluster(DIAL) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2)
        t = DistributedTable.queue(client, spec, 4, degraded=True, timeout=30, seed=0)
        t.insert(tagged([1, 2, 3, 4]), shard=0)
        victim = t.placement[1]
        client.run(_hold_first, "candidates", given_back == "refused", workers=[victim])
        lookup = lambda: coordinator(t).lookup()  # noqa: E731
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            sample = pool.submit(t.sample, 2)
            wait_for(lambda: client.run(_held_waiting, workers=[victim])[victim], "the sample's candidates held")
            if writer == "client":
                insert = pool.submit(DistributedTable.attach(t.name, client).insert, tagged([5, 6]), shard=0)
            else:
                insert = client.submit(_insert_in_task, t.name, [5, 6], workers=[t.placement[0]], pure=False)
            # committed, and (before the fix) its eviction to max_size queued behind the sample's hold
            wait_for(lambda: insert.done() or lookup()["waiting"]["samples"] == 1, "the insert committed")
            assert lookup()["size"] == 6
            if given_back == "worker lost":
                client.run(_kill_self, workers=[victim], wait=False)
                assert sample.result(timeout=60)["tag"].numpy()[:, 0].tolist() == [1, 2]
            else:
                client.run(_release_held, workers=[victim])
                with pytest.raises(gf.SpecError, match="injected"):
                    sample.result(timeout=60)
            if writer == "client":
                assert insert.result(timeout=60).shards.tolist() == [0, 0]
            else:
                assert insert.result(timeout=60) == ([0, 0], 1)
        if given_back == "refused":  # (the hold is spent: shard 1's worker answers from now on)
            assert t.sample(2)["tag"].numpy()[:, 0].tolist() == [1, 2]
        assert t.sample(4)["tag"].numpy()[:, 0].tolist() == [3, 4, 5, 6]
        info = t.info()
        rl = info["rate_limiter"]
        assert info["size"] == info["coordinator_size"] == 0 and rl["inserts"] == rl["samples"] == 6, info
        assert info["totals"]["removed"] == 0  # the remover never ran
        t.close()
