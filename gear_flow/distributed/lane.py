"""The fast lane: control requests to a worker on the same machine over a Unix socket.

A table whose shards a handle reads from shared memory (same machine) still
asks their owner for every selection: a ``sample_part`` draw, masses, priority
updates.  Through Dask's comm such a round trip costs ~0.35 ms on a 2-core
host (tornado streams, msgpack framing, the connection pool); over a Unix
socket served by an ``asyncio`` server on the worker's event loop it costs
~0.06 ms, and a 256-window batch read from shared memory ~1 ms less
(``pipelines/bench_distributed.py``).  The data never takes either path: it
is copied from the shared rings.

What travels is the same request as over the comm (operation, protocol
version, arguments), checked by the same code (:meth:`GearFlowWorker.serve
<gear_flow.distributed.plugin.GearFlowWorker.serve>`) and run the same way
(small operations on the event loop, the rest in the plugin's threads).  A
message is one pickle (protocol 5) with its NumPy buffers out of band::

    b"GFL1" | head bytes (uint32) | buffers (uint32) | buffer sizes (uint64 each) | head | buffers

The socket lives in a directory only the worker's user can enter
(``/dev/shm/gf_<pid>_lane*``, mode 0700), so nothing listens beyond this
machine and only the processes that may map the shared rings may connect;
it is removed with the worker, and :func:`gear_flow.storage.shared.sweep`
removes those of workers that died.  Only :data:`LANE_OPS` (control
operations with small replies) take the lane; a connection that fails sends
later requests to that worker over the comm, and that request too when it
never left or is one of :data:`RESENDABLE_OPS` (a draw whose reply was lost
is not drawn again: the sample fails, or the worker counts as lost).

Across machines (and with shared memory off) a worker whose comm is plain
TCP also serves its lane on a TCP socket of its own, on the host its comm
listens on (``distributed.tcp-lane``): draws travel there with their windows
in the reply, as out-of-band buffers, at a fraction of the comm's cost per
message.  It takes the same messages and checks, and only
:data:`LANE_OPS`; clusters on TLS or UCX keep everything on the comm.

A handle's event loop keeps asyncio connections (:meth:`Lanes.call`); a
learner sampling in its own thread (:mod:`.thread_sample`) uses blocking
ones (:meth:`Lanes.send_all`, :meth:`Lanes.read_all`): every request sent,
then every reply read, with no event loop in between.  A server reads each
request straight into its buffers (:class:`_LaneConnection`), so inserts
take the lanes too: their episodes land in the arrays the worker writes its
rings from, with no copy through a stream's buffer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import shutil
import socket
import struct
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import dask.config
import numpy as np
from dask.utils import parse_timedelta

from ..config import get as config_get
from ..errors import GearFlowError, ProtocolError
from ..storage.reuse import Reuse
from ..storage.shared import private_dir
from .operations import WORKER_OPS

logger = logging.getLogger(__name__)

#: operations a handle sends over the lane when it has one to the worker (an insert's steps included: its
#: episodes are received straight into the arrays they become); each one's ``lane`` claim in :mod:`.operations`
LANE_OPS = frozenset(op.name for op in WORKER_OPS.values() if op.lane)
#: lane operations a worker acts on once however often they come, so a request whose lane reply was lost may
#: go again over the comm (reads, priorities set to given values, an insert's steps, an abort, a sample's
#: finish); a draw, an uncount or a new epoch is never sent twice: the worker may have acted.  Each one's
#: ``resendable`` claim, and why, in :mod:`.operations`
RESENDABLE_OPS = frozenset(op.name for op in WORKER_OPS.values() if op.resendable)
MAGIC = b"GFL1"
#: prefix of a TCP lane's address (any other is a Unix socket's path)
TCP = "tcp://"
_HEADER = struct.Struct("<4sII")
#: largest message a lane accepts (control messages are kilobytes; a larger one is refused, not read)
MAX_BYTES = 1 << 28
#: largest reply a handle reads (a batch's windows come in draws' replies over a TCP lane)
MAX_REPLY_BYTES = 1 << 36
MAX_BUFFERS = 1024
#: errors of a lane connection (the request then goes over the comm)
LANE_ERRORS = (OSError, EOFError, asyncio.IncompleteReadError, ProtocolError)


#: a blocking sender joins a message this small into one write; a larger one's buffers (an insert's episodes)
#: are written straight from their arrays, not copied into one
JOIN_BYTES = 1 << 18
#: a large reply is written this many bytes at a time, each sent before the next is handed over
WRITE_CHUNK = 1 << 19


async def _write(parts: list, write: Callable, writelines: Callable, drain: Callable[[], Awaitable]) -> None:
    """Write a message's parts with ``write``/``writelines``; a large buffer in chunks, each drained before
    the next.

    asyncio's transport keeps what the socket did not take at once in one
    buffer that it trims from the front after every send (Python 3.11):
    handing it megabytes at once costs a quadratic number of byte moves, so
    windows in a reply (and episodes in a request) go a chunk at a time,
    straight from their buffers.
    """
    small = []
    for p in parts:
        m = memoryview(p).cast("B")
        if m.nbytes <= WRITE_CHUNK:
            small.append(m)
            continue
        if small:
            writelines(small)
            small = []
        for i in range(0, m.nbytes, WRITE_CHUNK):
            write(m[i : i + WRITE_CHUNK])
            await drain()
    if small:
        writelines(small)
    await drain()


class NotSent(ConnectionError):
    """A request that never left: its connection could not be opened or written (:meth:`Lanes.send_all`)."""


def _host_port(addr: str) -> tuple[str, int]:
    from distributed.comm.addressing import parse_host_port

    return parse_host_port(addr[len(TCP) :])


async def _open(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An asyncio connection to the lane at ``path`` (a Unix socket's path, or ``tcp://host:port``)."""
    if path.startswith(TCP):
        return await asyncio.open_connection(*_host_port(path))
    return await asyncio.open_unix_connection(path)


def _pair(reply: Any) -> tuple[bool, Any]:
    """``reply`` if it is a lane reply, ``(ok, value)``; else ProtocolError."""
    if not (isinstance(reply, tuple) and len(reply) == 2):
        raise ProtocolError(f"fast lane: a reply is a pair, got {type(reply).__name__}")
    return reply


#: NumPy buffers at least this large travel out of band (not copied into the pickle); smaller ones inside it,
#: so that a control message is one pickle: a read or write per buffer costs more than copying a few KB
OUT_OF_BAND_BYTES = 1 << 16


def pack(obj: Any) -> list:
    """The parts of a message carrying ``obj`` (NumPy buffers of 64 KB or more out of band, not copied).

    Parameters
    ----------
    obj : object
        Picklable.

    Returns
    -------
    list of bytes-like
        Header, pickle and buffers, to write in order.
    """
    raw: list = []

    def out_of_band(b: pickle.PickleBuffer) -> bool:
        m = b.raw()
        if m.nbytes < OUT_OF_BAND_BYTES:
            return True  # in the pickle
        raw.append(m)
        return False

    head = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    sizes = struct.pack(f"<{len(raw)}Q", *(r.nbytes for r in raw))
    return [_HEADER.pack(MAGIC, len(head), len(raw)) + sizes, head, *raw]


async def read(reader: asyncio.StreamReader, limit: int = MAX_BYTES) -> Any:
    """Read one message.

    Parameters
    ----------
    reader : asyncio.StreamReader
        The connection.
    limit : int, default MAX_BYTES
        Largest message accepted (a handle reads replies with
        :data:`MAX_REPLY_BYTES`).

    Returns
    -------
    object
        What was packed.

    Raises
    ------
    asyncio.IncompleteReadError
        The other end closed the connection.
    ProtocolError
        Not a lane message, too large, or not readable.
    """
    n, k = _header(await reader.readexactly(_HEADER.size))
    sizes = _sizes(n, await reader.readexactly(8 * k) if k else b"", limit)
    head = await reader.readexactly(n)
    return _loads(head, [await reader.readexactly(s) for s in sizes])


def _read_blocking(sock: socket.socket) -> Any:
    """:func:`read` from a blocking socket (a caller thread's connection); EOFError when it was closed."""
    n, k = _header(_recv_exactly(sock, _HEADER.size))
    sizes = _sizes(n, _recv_exactly(sock, 8 * k) if k else b"", MAX_REPLY_BYTES)
    head = _recv_exactly(sock, n)
    bufs = _arena(sizes) if k else []  # not zeroed, and pages already faulted in when reused (a draw's windows)
    for b in bufs:
        _recv_into(sock, b)
    return _loads(head, bufs)


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    _recv_into(sock, buf)
    return buf


def _recv_into(sock: socket.socket, buf: bytearray | np.ndarray) -> None:
    view, got = memoryview(buf).cast("B"), 0
    while got < view.nbytes:
        k = sock.recv_into(view[got:])
        if not k:
            raise EOFError("fast lane: the worker closed the connection")
        got += k


def _header(raw: bytes) -> tuple[int, int]:
    magic, n, k = _HEADER.unpack(raw)
    if magic != MAGIC or k > MAX_BUFFERS:
        raise ProtocolError(f"fast lane: not a gear_flow lane message (magic {magic!r}, {k} buffers)")
    return n, k


def _sizes(n: int, raw: bytes, limit: int) -> tuple[int, ...]:
    sizes = struct.unpack(f"<{len(raw) // 8}Q", raw)
    if n + sum(sizes) > limit:
        raise ProtocolError(f"fast lane: a message of {n + sum(sizes)} bytes exceeds {limit}")
    return sizes


def _loads(head: bytes, bufs: list) -> Any:
    try:
        return pickle.loads(head, buffers=bufs)
    except Exception as e:
        raise ProtocolError(f"fast lane: unreadable message ({type(e).__name__}: {e})") from None


#: bytes a server connection reads at once while it parses a message's header, sizes and pickle
_SCRATCH = 1 << 16
_HEADER_PHASE, _SIZES_PHASE, _HEAD_PHASE, _BUFFERS_PHASE = range(4)
#: a message's out-of-band buffers start at multiples of this from its arena's start (every dtype stays aligned)
_ALIGN = 64
#: arenas of received requests, handed out again once nothing references them: a worker process runs with
#: ``MALLOC_TRIM_THRESHOLD_`` set, so a fresh buffer of megabytes is fresh pages every time, and faulting them
#: in as an insert's episodes arrive cost as much as the socket's copy (10 MB: ~1.5 ms)
_ARENAS = Reuse()


def _arena(sizes: tuple[int, ...]) -> list[np.ndarray]:
    """Uninitialised uint8 buffers of ``sizes`` bytes, views of one arena (each start a multiple of 64 bytes
    from the arena's)."""
    offs, end = [], 0
    for n in sizes:
        offs.append(end)
        end += -(-n // _ALIGN) * _ALIGN
    arena = _ARENAS.empty((end,), np.uint8)
    return [arena[o : o + n] for o, n in zip(offs, sizes)]


class _LaneConnection(asyncio.BufferedProtocol):
    """One connection to a :class:`LaneServer`: each request received straight into its buffers.

    A request's out-of-band buffers (an insert's episodes) are read by the
    socket into the arrays they become, with no copy through a stream's
    buffer: asyncio's ``StreamReader`` moves megabytes at a fraction of the
    socket's speed.  Requests are served one at a time, in order (reading
    pauses while one is served), and a reply is written as the socket takes
    it.  Anything that is not a lane message, or is larger than the
    server's limit, closes the connection without an answer.
    """

    def __init__(self, server: LaneServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray(_SCRATCH)  # header, sizes and pickle land here: _buf[_start:_end] unparsed
        self._start = self._end = 0
        self._phase = _HEADER_PHASE
        self._n = self._k = 0
        self._sizes: tuple[int, ...] = ()
        self._head = b""
        self._bufs: list[np.ndarray] = []
        self._arena: list[np.ndarray] = []  # where the request's out-of-band buffers go (see _arena)
        self._into: memoryview | None = None  # the buffer the socket reads into directly, ...
        self._got = 0  # ... and how much of it has arrived
        self._busy = False  # a request is being served: nothing more is parsed until its reply is written
        self._closed = False
        self._write_paused = False
        self._drained: asyncio.Future | None = None

    # -- receiving ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102 - asyncio's protocol
        self.transport = transport
        transport.set_write_buffer_limits(high=0)  # a write is drained once the socket took all of it
        self.server._connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:  # noqa: D102 - asyncio's protocol
        if self._into is not None:
            return self._into[self._got :]
        if self._end == len(self._buf):  # full: keep the unparsed bytes at the front of a buffer with room
            self._reserve(len(self._buf) - self._start + _SCRATCH)
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:  # noqa: D102 - asyncio's protocol
        if self._into is not None:
            self._got += nbytes
            if self._got < len(self._into):
                return
            self._into = None  # this buffer is complete
        else:
            self._end += nbytes
        self._parse()

    def eof_received(self) -> bool:  # noqa: D102 - asyncio's protocol
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102 - asyncio's protocol
        self._closed = True
        self.server._connections.discard(self)
        self._wake(ConnectionResetError("fast lane: the connection closed"))

    def _reserve(self, size: int) -> None:
        """Move the unparsed bytes to the front of a buffer of at least ``size`` bytes (a new one: the
        transport may still hold a view of the old one)."""
        buf = bytearray(max(size, _SCRATCH))
        n = self._end - self._start
        buf[:n] = self._buf[self._start : self._end]
        self._buf, self._start, self._end = buf, 0, n

    def _parse(self) -> None:
        """Take what the unparsed bytes complete: the next phase of the message, the message itself."""
        limit = MAX_BYTES
        while not (self._busy or self._closed or self._into is not None):
            avail = self._end - self._start
            try:
                if self._phase == _HEADER_PHASE:
                    if avail < _HEADER.size:
                        break
                    self._n, self._k = _header(bytes(self._buf[self._start : self._start + _HEADER.size]))
                    self._start += _HEADER.size
                    self._phase = _SIZES_PHASE
                elif self._phase == _SIZES_PHASE:
                    if avail < 8 * self._k:
                        break
                    raw = bytes(self._buf[self._start : self._start + 8 * self._k])
                    self._sizes = _sizes(self._n, raw, limit)
                    self._start += 8 * self._k
                    self._phase = _HEAD_PHASE
                elif self._phase == _HEAD_PHASE:
                    if avail < self._n:
                        if len(self._buf) - self._start < self._n:  # a pickle larger than the room left
                            self._reserve(self._n)
                        break
                    self._head = bytes(self._buf[self._start : self._start + self._n])
                    self._start += self._n
                    self._bufs = []
                    self._arena = _arena(self._sizes) if self._k else []
                    self._phase = _BUFFERS_PHASE
                elif len(self._bufs) < self._k:  # the next out-of-band buffer: what is here, then the socket
                    size = self._sizes[len(self._bufs)]
                    b = self._arena[len(self._bufs)]
                    take = min(avail, size)
                    b[:take] = self._buf[self._start : self._start + take]
                    self._start += take
                    self._bufs.append(b)
                    if take < size:
                        self._into, self._got = memoryview(b), take
                else:  # complete
                    msg = _loads(self._head, self._bufs)
                    self._head, self._bufs, self._arena, self._phase = b"", [], [], _HEADER_PHASE
                    if len(self._buf) > _SCRATCH and avail <= _SCRATCH:  # a large pickle's room: given back
                        self._reserve(_SCRATCH)
                    self._busy = True
                    self.transport.pause_reading()
                    asyncio.ensure_future(self._answer(msg))
            except ProtocolError as e:
                logger.warning("%s; connection closed", e)
                self._closed = True
                self.transport.close()
                return
        if self._start == self._end:
            self._start = self._end = 0

    # -- answering ------------------------------------------------------------------------------
    async def _answer(self, msg: Any) -> None:
        try:
            await self._reply(msg)
        except BaseException as e:  # the server's own failure (or cancellation): the handle sees the connection close
            self._closed = True
            self.transport.close()
            if not isinstance(e, Exception):
                raise
            logger.warning("fast lane: a request failed in the server (%s: %s); connection closed", type(e).__name__, e)

    async def _reply(self, msg: Any) -> None:
        server = self.server
        if not isinstance(msg, dict):
            reply = (False, ProtocolError(f"fast lane: a request is a dict, got {type(msg).__name__}"))
        elif not (isinstance(msg.get("action"), str) and msg["action"] in server.ops):
            reply = (False, ProtocolError(f"fast lane: {msg.get('action')!r} does not take the lane"))
        else:
            reply = await server._serve(msg.get("action"), msg.get("args"), msg.get("v"))
        server.served += 1
        try:
            parts = pack(reply)
        except Exception as e:  # a result that cannot travel this way
            parts = pack((False, GearFlowError(f"fast lane: reply not serializable ({type(e).__name__})")))
        del msg, reply  # an idle connection keeps no request or reply (episodes, windows) alive
        try:
            await _write(parts, self.transport.write, self.transport.writelines, self._drain)
        except (ConnectionError, OSError):  # the handle gave up on this request and closed the connection
            self.transport.close()
            return
        del parts
        self._busy = False
        if not self._closed:
            self.transport.resume_reading()
            self._parse()  # a request that arrived meanwhile

    async def _drain(self) -> None:
        if self._closed:
            raise ConnectionResetError("fast lane: the connection closed")
        if self._write_paused:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def pause_writing(self) -> None:  # noqa: D102 - asyncio's protocol
        self._write_paused = True

    def resume_writing(self) -> None:  # noqa: D102 - asyncio's protocol
        self._write_paused = False
        self._wake(None)

    def _wake(self, exc: BaseException | None) -> None:
        f, self._drained = self._drained, None
        if f is not None and not f.done():
            if exc is None:
                f.set_result(None)
            else:
                f.set_exception(exc)

    def abort(self) -> None:
        """Drop the connection now (the server is closing)."""
        if self.transport is not None:
            self.transport.abort()


class LaneServer:
    """A worker's (or the coordinator's) end: a Unix-socket server on its event loop answering with ``serve``.

    Parameters
    ----------
    serve : callable
        ``await serve(action, args, v)`` returns ``(True, result)`` or
        ``(False, GearFlowError)`` (:meth:`GearFlowWorker.serve
        <gear_flow.distributed.plugin.GearFlowWorker.serve>`, or the
        coordinator's :meth:`~gear_flow.distributed.coordinator.GearFlowCoordinator.serve`).
    ops : frozenset of str, default LANE_OPS
        The operations it takes; any other is answered with a
        ProtocolError (it goes over the comm).
    """

    def __init__(
        self, serve: Callable[[Any, Any, Any], Awaitable[tuple[bool, Any]]], ops: frozenset[str] = LANE_OPS
    ) -> None:
        self._serve = serve
        self.ops = ops
        self.path: str | None = None
        #: requests answered (their errors included)
        self.served = 0
        self._dir: str | None = None
        self._server: asyncio.AbstractServer | None = None
        self._starting: asyncio.Future | None = None
        #: address of the TCP listener (``tcp://host:port``), once started
        self.tcp: str | None = None
        self._tcp_server: asyncio.AbstractServer | None = None
        self._tcp_starting: asyncio.Future | None = None
        self._connections: set[_LaneConnection] = set()  # open connections: dropped with the server
        self._closed = False  # (a start that comes, or ends, after the close leaves nothing behind)

    async def start(self) -> str:
        """Start listening (once); the socket's path.

        Returns
        -------
        str
            Path of the Unix socket.
        """
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        return await asyncio.shield(self._starting)

    async def start_tcp(self, host: str, contact: str) -> str:
        """Start listening on TCP at ``host`` (once), an ephemeral port; the address handles connect to.

        Parameters
        ----------
        host : str
            The host the worker's comm listens on (nothing listens beyond
            it; ``0.0.0.0`` only when the comm itself listens there).
        contact : str
            The host handles reach the worker at (its address's).

        Returns
        -------
        str
            ``tcp://contact:port``.

        Raises
        ------
        OSError
            The lane cannot listen there (also on later calls).
        """
        if self._tcp_starting is None:
            self._tcp_starting = asyncio.ensure_future(self._start_tcp(host, contact))
        return await asyncio.shield(self._tcp_starting)

    async def start_tcp_beside(self, node: Any) -> str | None:
        """:meth:`start_tcp` on the host the comm of Dask server ``node`` (a worker or the scheduler)
        listens on, advertised with the host its address names.

        Parameters
        ----------
        node : distributed.core.Server
            The worker or scheduler this lane serves beside.

        Returns
        -------
        str or None
            ``tcp://contact:port``; None when ``distributed.tcp-lane`` is
            off, the comm is not plain TCP (TLS, UCX: those stay the comm's),
            or the lane cannot listen there (logged).
        """
        from distributed.comm.addressing import get_address_host, parse_address

        if not config_get("distributed.tcp-lane") or parse_address(node.address)[0] != "tcp":
            return None
        listener = getattr(node, "listener", None)
        listen = getattr(listener, "listen_address", None) or node.address
        try:
            return await self.start_tcp(get_address_host(listen), get_address_host(node.address))
        except OSError as e:  # e.g. a contact address that is not this machine's (NAT): the comm it is
            logger.info("no TCP lane on %s (%s); handles use the comm", listen, e)
            return None

    async def _start_tcp(self, host: str, contact: str) -> str:
        from distributed.comm.addressing import unparse_host_port

        self._check_open()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, 0), family=family)  # one socket, one address
        self._tcp_server = await asyncio.get_running_loop().create_server(lambda: _LaneConnection(self), sock=sock)
        self.tcp = TCP + unparse_host_port(contact, sock.getsockname()[1])
        self._check_open()
        return self.tcp

    async def _start(self) -> str:
        self._check_open()
        self._dir = private_dir("lane")  # mode 0700, swept after a crash
        path = os.path.join(self._dir, "s")
        self._server = await asyncio.get_running_loop().create_unix_server(lambda: _LaneConnection(self), path=path)
        self.path = path
        self._check_open()
        return path

    def _check_open(self) -> None:
        """Raise once closed, after letting go of what a start made meanwhile: a lane asked for as its worker
        (or the scheduler) closed made its directory after the close had removed it, and it was left behind."""
        if self._closed:
            self.close()
            raise OSError("the lane is closed (its worker or scheduler is closing)")

    def close(self) -> None:
        """Stop listening, drop every open connection, remove the socket and its directory.

        A handle's next request on a dropped connection fails at once and
        goes over the comm, which reports a closing worker as lost.
        """
        self._closed = True
        for server in (self._server, self._tcp_server):
            if server is not None:
                server.close()
        for c in list(self._connections):
            c.abort()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._server = self._tcp_server = self._dir = self.path = self.tcp = None


class Lanes:
    """A handle's lanes: the socket of each same-machine worker, and idle connections to it."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}
        #: other lanes in use whose connections are kept for reuse (the coordinator's)
        self.kept: set[str] = set()
        self._idle: dict[str, list] = defaultdict(list)
        self._blocking: dict[str, list[socket.socket]] = defaultdict(list)  # idle connections of caller threads

    def route(self, addr: str, op: str, nbytes: int = 0) -> str | None:
        """The lane to ``addr`` for ``op``, or None (the comm).

        Parameters
        ----------
        addr : str
            Worker address.
        op : str
            Operation.
        nbytes : int, default 0
            Bytes of arrays the request carries: one the lane would refuse
            as too large (over half of :data:`MAX_BYTES`) takes the comm.

        Returns
        -------
        str or None
            Socket path.
        """
        return self.paths.get(addr) if op in LANE_OPS and nbytes <= MAX_BYTES // 2 else None

    async def probe(self, path: str, timeout: float | None = None) -> bool:
        """Can a connection to the lane at ``path`` be opened within ``timeout`` seconds (a firewall may
        drop the lane's port while letting the comm's through)?  The connection is kept for use.

        Parameters
        ----------
        path : str
            Socket path or ``tcp://host:port``.
        timeout : float, optional
            Seconds; default Dask's ``distributed.comm.timeouts.connect``,
            at most 5.

        Returns
        -------
        bool
            Whether it opened.
        """
        if timeout is None:
            timeout = min(float(parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), "s")), 5.0)
        try:
            rw = await asyncio.wait_for(_open(path), timeout)
        except (TimeoutError, OSError, ValueError):
            return False
        self._idle[path].append(rw)
        return True

    def drop(self, addr: str) -> None:
        """Stop using ``addr``'s lane (it failed): its requests go over the comm.

        Parameters
        ----------
        addr : str
            Worker address.
        """
        self.close_path(self.paths.pop(addr, None))

    def close_path(self, path: str | None) -> None:
        """Close the idle connections to the lane at ``path``.

        Parameters
        ----------
        path : str or None
            Socket path or ``tcp://host:port`` (None: nothing to do).
        """
        self.kept.discard(path)
        for _, w in self._idle.pop(path, []):
            w.close()
        for sock in self._blocking.pop(path, []):
            sock.close()

    def clear(self) -> None:
        """Forget every lane (the placement changed: they are learnt again)."""
        for addr in list(self.paths):
            self.drop(addr)

    async def call(self, path: str, op: str, args: dict, v: int) -> tuple[bool, Any]:
        """One request over the lane at ``path``.

        Parameters
        ----------
        path : str
            Socket path.
        op : str
            Operation.
        args : dict
            Its arguments.
        v : int
            Protocol version.

        Returns
        -------
        tuple
            ``(True, result)`` or ``(False, error)``.

        Raises
        ------
        NotSent
            No connection could be opened: the request never left.
        OSError, EOFError, asyncio.IncompleteReadError, ProtocolError
            The connection failed (:data:`LANE_ERRORS`); it is closed.
        """
        idle = self._idle[path]
        while idle and (idle[-1][0].at_eof() or idle[-1][1].is_closing()):  # closed by the worker meanwhile
            idle.pop()[1].close()
        if idle:
            r, w = idle.pop()
        else:
            try:
                r, w = await _open(path)
            except (OSError, ValueError) as e:
                raise NotSent(f"fast lane {path}: cannot connect ({type(e).__name__}: {e})") from e
        try:
            await _write(pack({"action": op, "args": args, "v": v}), w.write, w.writelines, w.drain)
            reply = await read(r, MAX_REPLY_BYTES)
        except BaseException:  # failed or cancelled mid-request: the connection's state is unknown
            w.close()
            raise
        idle.append((r, w))
        return _pair(reply)

    def send_all(self, requests: list[tuple[str, str, dict]], v: int, timeout: float) -> list:
        """Send requests over lanes from a caller's thread (blocking), each on a connection of its own;
        read the replies with :meth:`read_all` (the workers answer them in parallel meanwhile).

        Parameters
        ----------
        requests : list of tuple
            ``(socket path, operation, arguments)``; a path None (the lane
            was dropped meanwhile) fails that request.
        v : int
            Protocol version.
        timeout : float
            Seconds a send, or later a reply, may take.

        Returns
        -------
        list
            Per request, its connection (with its path) for :meth:`read_all`,
            or a :class:`NotSent` saying why it could not be sent (the
            connection closed).
        """
        sent: list = []
        try:
            for path, op, args in requests:
                sock = None
                parts = pack({"action": op, "args": args, "v": v})
                if sum(memoryview(p).nbytes for p in parts) <= JOIN_BYTES:
                    parts = [b"".join(parts)]
                try:
                    if path is None:
                        raise ConnectionError("fast lane: dropped")
                    sock = self._connect(path, timeout)
                    for p in parts:
                        sock.sendall(p)
                except LANE_ERRORS as e:
                    if sock is not None:
                        sock.close()
                    sent.append(NotSent(f"fast lane {path}: {type(e).__name__}: {e}"))
                else:
                    sent.append((path, sock))
        except BaseException:  # interrupted: what was sent has replies nobody will read
            self.abandon(sent)
            raise
        return sent

    def read_all(self, sent: list) -> Iterator:
        """The replies to :meth:`send_all`'s requests, in order, each as soon as it is read.

        Parameters
        ----------
        sent : list
            What :meth:`send_all` returned.

        Yields
        ------
        tuple or Exception
            Per request, ``(True, result)``, ``(False, error)``, or the
            exception (:data:`LANE_ERRORS`) that broke its connection (closed;
            whether the worker ran the request is unknown).  Connections
            whose replies are left unread (the caller stopped) are closed.
        """
        settled = 0
        try:
            for item in sent:
                reply = self.read_one(item)
                settled += 1
                yield reply
        finally:
            self.abandon(sent[settled:])

    def read_one(self, item: Any) -> Any:
        """The reply to one of :meth:`send_all`'s requests (see :meth:`read_all`); threads may read several
        at once.

        Parameters
        ----------
        item : object
            One item of what :meth:`send_all` returned.

        Returns
        -------
        tuple or Exception
            ``(True, result)``, ``(False, error)``, or the exception that
            kept the request from being sent or broke its connection.
        """
        if isinstance(item, BaseException):
            return item
        path, sock = item
        try:
            reply = _pair(_read_blocking(sock))
        except LANE_ERRORS as e:
            sock.close()
            return e
        if path in self.kept or path in self.paths.values():
            self._blocking[path].append(sock)
            if not (path in self.kept or path in self.paths.values()):  # dropped as it went back: not kept
                self._forget(path, sock)
        else:  # the lane was dropped meanwhile
            sock.close()
        return reply

    def _forget(self, path: str, sock: socket.socket) -> None:
        try:
            self._blocking[path].remove(sock)
        except ValueError:  # taken meanwhile by close_path, which closes it
            return
        sock.close()

    @staticmethod
    def abandon(sent: list) -> None:
        """Close the connections of requests whose replies will not be read.

        Parameters
        ----------
        sent : list
            Items of what :meth:`send_all` returned.
        """
        for item in sent:
            if not isinstance(item, BaseException):
                item[1].close()

    def _connect(self, path: str, timeout: float) -> socket.socket:
        try:
            sock = self._blocking[path].pop()
        except IndexError:
            if path.startswith(TCP):
                sock = socket.create_connection(_host_port(path), timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(timeout)
                    sock.connect(path)
                except BaseException:
                    sock.close()
                    raise
        sock.settimeout(timeout)
        return sock
