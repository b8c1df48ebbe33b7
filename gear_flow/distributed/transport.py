"""How a table handle reaches the cluster: the scheduler's coordinator and the shard workers.

Requests to a shard worker go to its ``gear_flow`` comm handler (in-process
when the handle runs on that worker) with NumPy arrays as serialized frames.
A worker counts as lost when the connection fails or the scheduler no longer
knows it; a slow reply is waited for again (``distributed.rpc-retries``
times ``distributed.rpc-timeout``) as long as the scheduler still has the
worker, then reported as a timeout, never silently as a loss.
"""

from __future__ import annotations

import asyncio

from .. import config
from ..errors import CoordinatorLostError, GearFlowError
from . import protocol
from .plugin import PLUGIN_NAME

COMM_ERRORS = (OSError, asyncio.TimeoutError)


class WorkerLost(Exception):
    """Internal: a shard worker cannot be reached (or the scheduler removed it)."""

    def __init__(self, addr, cause):
        super().__init__(f"{addr}: {cause}")
        self.addr = addr
        self.cause = cause


class Retry(Exception):
    """Internal: the shard set changed (degraded mode) or a selection went stale; redo the operation."""


class Context:
    """How this handle reaches the cluster: from a client, or from inside a worker."""

    def __init__(self, client=None, worker=None):
        self.client = client
        self.worker = worker
        if worker is not None:
            self.loop = worker.loop
            self.scheduler = worker.scheduler
            self.rpc = worker.rpc
            self.local_addr = worker.address
            self.local_plugin = worker.plugins.get(PLUGIN_NAME)
            self.owner = worker.address
        else:
            self.loop = client.loop
            self.scheduler = client.scheduler
            self.rpc = client.rpc
            self.local_addr = None
            self.local_plugin = None
            self.owner = client.id

    def sync(self, fn, *args, **kwargs):
        if self.worker is not None:
            from distributed.utils import sync

            return sync(self.loop, fn, *args, **kwargs)
        return self.client.sync(fn, *args, **kwargs)


def unwrap(resp):
    """The result of a handler reply, or its error raised with its own type."""
    if not isinstance(resp, dict):
        raise CoordinatorLostError(f"no reply (got {type(resp).__name__}); the scheduler may have gone away")
    if resp.get("status") != "OK":
        err = resp.get("error")
        raise err if isinstance(err, BaseException) else GearFlowError(str(err))
    return resp["result"]


async def coord(ctx: Context, op: str, name: str | None, **kw):
    """One request to the coordinator on the scheduler."""
    try:
        resp = await ctx.scheduler.gear_flow_coord(action=op, name=name, v=protocol.VERSION, **kw)
    except COMM_ERRORS as e:
        raise CoordinatorLostError(
            f"table {name!r}: the scheduler at {ctx.scheduler.address} cannot be reached ({type(e).__name__}: {e})"
        ) from e
    return unwrap(resp)


async def call(ctx: Context, addr: str, op: str, *, table: str | None = None, **args):
    """One request to a shard worker (in-process when it is this worker)."""
    if addr == ctx.local_addr and ctx.local_plugin is not None:
        return await ctx.local_plugin.run(op, **args)
    from distributed.protocol import to_serialize

    timeout = config.get("distributed.rpc-timeout")
    retries = int(config.get("distributed.rpc-retries") or 0)
    try:
        reply = asyncio.ensure_future(ctx.rpc(addr).gear_flow(action=op, args=to_serialize(args), v=protocol.VERSION))
    except COMM_ERRORS as e:
        raise WorkerLost(addr, e) from e
    for attempt in range(retries + 1):
        try:
            resp = await asyncio.wait_for(asyncio.shield(reply), timeout)
            break
        except asyncio.TimeoutError:
            alive = True
            if table is not None:
                try:
                    alive = await coord(ctx, "worker_alive", table, address=addr)
                except GearFlowError:
                    alive = True
            if not alive:
                reply.cancel()
                raise WorkerLost(addr, "the scheduler removed it") from None
            if attempt == retries:
                reply.cancel()
                raise GearFlowError(
                    f"worker {addr} did not answer {op!r} within {(retries + 1) * timeout:g} s although the "
                    "scheduler still has it (raise distributed.rpc-timeout for slow operations)"
                ) from None
        except COMM_ERRORS as e:
            raise WorkerLost(addr, e) from e
    return unwrap(resp)
