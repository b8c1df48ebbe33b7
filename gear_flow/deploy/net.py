"""Which address a process listens on: only the one it was given, or else the one it needs.

Dask listens on every interface when it is given no host, and its HTTP servers (dashboards,
``/health``, ``/metrics``) do so whenever their address has no host part (``:8787``), even when
the comm listens on one address.  These helpers turn the deployment's settings into one concrete
address that every listener of a process binds.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import SpecError

#: what a user writes to listen on every interface on purpose
ALL_INTERFACES = ("0.0.0.0", "::", "*")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address.

    Parameters
    ----------
    host : str
        An IPv4/IPv6 address (brackets allowed) or ``localhost``; other names are not resolved.

    Returns
    -------
    bool
        True for ``localhost``, ``127.0.0.0/8`` and ``::1``.
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def interface_ip(name: str) -> str:
    """The IPv4 address of a network interface.

    Parameters
    ----------
    name : str
        The interface (e.g. ``eth0``, ``ib0``, ``lo``).

    Returns
    -------
    str
        Its first IPv4 address.

    Raises
    ------
    SpecError
        No such interface here, or it has no IPv4 address.
    """
    import psutil

    addrs = psutil.net_if_addrs()
    if name not in addrs:
        raise SpecError(f"network interface {name!r} does not exist here; interfaces: {sorted(addrs)}")
    for a in addrs[name]:
        if a.family == socket.AF_INET:
            return a.address
    raise SpecError(f"network interface {name!r} has no IPv4 address")


def route_ip(host: str) -> str:
    """The local address this node uses to reach ``host`` (no packet is sent).

    Parameters
    ----------
    host : str
        A remote IPv4 address or name.

    Returns
    -------
    str
        ``127.0.0.1`` for a loopback ``host``, else the source address of the
        route the kernel picks.

    Raises
    ------
    SpecError
        The kernel knows no route (set ``GEAR_FLOW_HOST``).
    """
    if is_loopback(host):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError as e:
            raise SpecError(f"cannot tell which local address reaches {host!r} ({e}); set GEAR_FLOW_HOST") from None


def scheduler_host(address: str | None = None, scheduler_file: str | None = None) -> str | None:
    """The host of a scheduler address or of an existing scheduler file.

    Parameters
    ----------
    address : str, optional
        ``tls://10.0.0.5:8786``, or without a scheme (``10.0.0.5:8786``).
    scheduler_file : str, optional
        Read only when ``address`` is not given and the file exists.

    Returns
    -------
    str or None
        The host part; None when neither gives an address.
    """
    if not address and scheduler_file and Path(scheduler_file).is_file():
        try:
            info = json.loads(Path(scheduler_file).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:  # (Dask writes it in place: read while it starts)
            raise SpecError(
                f"scheduler file {scheduler_file} is not Dask's JSON ({e}); is the scheduler still starting?"
            ) from None
        address = info.get("address") if isinstance(info, dict) else None
        if not isinstance(address, str):
            raise SpecError(f"scheduler file {scheduler_file} names no address (a JSON object with a text 'address')")
    if not address:
        return None
    try:
        return urlsplit(address if "://" in address else f"tcp://{address}").hostname
    except ValueError as e:
        raise SpecError(f"scheduler address {address!r} cannot be read ({e})") from None


def listen_host(role: str, host: str | None = None, interface: str | None = None, scheduler: str | None = None,
                scheduler_file: str | None = None) -> str:  # fmt: skip
    """The one address a scheduler or worker binds.

    ``host`` wins (``0.0.0.0`` only when asked for), then ``interface``'s address; without either,
    a scheduler binds loopback (nothing beyond this machine unless asked) and a worker binds the
    address it reaches its scheduler from.

    Parameters
    ----------
    role : str
        ``"scheduler"`` or ``"worker"``.
    host : str, optional
        ``GEAR_FLOW_HOST``: an address of this node, or ``*`` for every interface.
    interface : str, optional
        ``GEAR_FLOW_INTERFACE``: a network interface whose address to bind.
    scheduler : str, optional
        A worker's scheduler address.
    scheduler_file : str, optional
        A worker's scheduler file (when no address is given).

    Returns
    -------
    str
        The address to bind.

    Raises
    ------
    SpecError
        A worker whose scheduler's address is not known yet, or an unusable interface.
    """
    if host:
        return "0.0.0.0" if host == "*" else host
    if interface:
        return interface_ip(interface)
    if role == "scheduler":
        return "127.0.0.1"
    target = scheduler_host(scheduler, scheduler_file)
    if target is None:
        raise SpecError(
            "cannot tell which address this worker should listen on: the scheduler file does not exist yet; "
            "set GEAR_FLOW_HOST (this node's address) or GEAR_FLOW_INTERFACE (e.g. eth0)"
        )
    return route_ip(target)


def join_host_port(host: str, port: int | str) -> str:
    """``host:port``, with an IPv6 host in brackets.

    Parameters
    ----------
    host : str
        An address or name (IPv6 with or without brackets).
    port : int or str
        The port.

    Returns
    -------
    str
        E.g. ``"10.0.0.5:8787"``, ``"[::1]:8787"``.
    """
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def http_address(value: str | None, host: str, default_port: int) -> str | None:
    """A dashboard address bound to ``host``: ``:8787`` or ``8787`` → ``HOST:8787``; ``none`` → None.

    An address with its own host (``10.0.0.5:8787``, ``0.0.0.0:8787``) is kept as given.

    Parameters
    ----------
    value : str or None
        The configured address (``GEAR_FLOW_DASHBOARD``, ``--dashboard-address``);
        None or empty: ``default_port`` on ``host``.
    host : str
        The address the process binds (:func:`listen_host`).
    default_port : int
        Port used when ``value`` gives none (8787 for a scheduler).

    Returns
    -------
    str or None
        The address to serve HTTP on; None for ``none``/``off``/``false``/``no``.

    Raises
    ------
    SpecError
        Not an address of that form, or a port outside 0 to 65535.
    """
    if value is None or value == "":
        return join_host_port(host, default_port)
    if http_off(value):
        return None
    value = str(value)
    if value.startswith(":") or value.isdigit():
        return join_host_port(host, _port(value.removeprefix(":"), value))
    there, sep, port = value.rpartition(":")
    if not sep or not there.strip("[]") or (":" in there and not there.startswith("[")):
        raise SpecError(f"dashboard address {value!r} must be :PORT, PORT, HOST:PORT ([IPv6]:PORT) or none")
    return join_host_port(there.strip("[]"), _port(port, value))


def _port(text: str, value: str) -> int:
    """``text`` as a port number (0 to 65535), or an error naming the whole address ``value``."""
    if not text.isdigit() or int(text) > 65535:
        raise SpecError(f"dashboard address {value!r}: port {text!r} must be a number from 0 to 65535")
    return int(text)


def http_off(value: str | None) -> bool:
    """Whether a configured dashboard address asks for no HTTP server: ``none``, ``off``, ``false`` or ``no``.

    Parameters
    ----------
    value : str or None
        ``GEAR_FLOW_DASHBOARD``, ``--dashboard-address``, ``dashboard_address=``.

    Returns
    -------
    bool
        True for those words, in any case.
    """
    return value is not None and str(value).strip().lower() in ("none", "off", "false", "no")


def environ(name: str) -> str | None:
    """An environment variable, an empty value counting as unset.

    Parameters
    ----------
    name : str
        The variable.

    Returns
    -------
    str or None
        Its value, or None when unset or empty.
    """
    return os.environ.get(name) or None
