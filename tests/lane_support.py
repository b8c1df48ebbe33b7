"""Raw connections to a lane (a worker's or the coordinator's), for the tests of what it refuses."""

from __future__ import annotations

import asyncio

from gear_flow.distributed.lane import MAGIC, _open, pack


async def raw_exchange(path: str, data: bytes) -> bytes:
    """Send ``data`` on a new connection to the lane at ``path``; what comes back until it closes."""
    r, w = await _open(path)
    w.write(data)
    await w.drain()
    try:
        return await r.read()
    finally:
        w.close()


def check_garbage_is_refused(path: str) -> None:
    """Not a lane message, a pickle that cannot be read, or a message too large: the server closes the
    connection without answering (and without reading the large one)."""
    assert asyncio.run(raw_exchange(path, b"GET / HTTP/1.1\r\n\r\n")) == b""
    bad = pack({"action": "lookup"})
    bad[1] = b"\x80\x05not a pickle"
    bad[0] = bad[0][:4] + len(bad[1]).to_bytes(4, "little") + bad[0][8:]
    assert asyncio.run(raw_exchange(path, b"".join(bad))) == b""
    huge = MAGIC + (1 << 30).to_bytes(4, "little") + (0).to_bytes(4, "little")
    assert asyncio.run(raw_exchange(path, huge)) == b""


def break_lane_after(op, dask_worker=None):
    """This worker's lane serves the next ``op``, then breaks the connection before the reply (once)."""
    from gear_flow.distributed.plugin import PLUGIN_NAME

    plugin = dask_worker.plugins[PLUGIN_NAME]
    real = plugin.lane._serve
    plugin.broke = []

    async def serve(action, args, v):
        reply = await real(action, args, v)
        if action != op:
            return reply
        plugin.broke.append((action, reply[0]))
        plugin.lane._serve = real
        raise ConnectionResetError("the connection broke before the reply")

    plugin.lane._serve = serve
