"""Connecting to a cluster from the command line: certificates, a Client, a table by name."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import CLIError, first_line

if TYPE_CHECKING:
    from distributed import Client
    from distributed.security import Security

    from ..distributed import DistributedTable


def security_from_args(args: argparse.Namespace, role: str = "client") -> Security | None:
    """A ``distributed.Security`` from --tls-dir / --tls-* flags.

    Parameters
    ----------
    args : argparse.Namespace
        With ``tls_dir``, ``tls_ca_file``, ``tls_cert`` and ``tls_key``; the
        single-file flags override the folder's files.
    role : str, default "client"
        Whose certificate to use from ``--tls-dir`` (``<role>.pem``,
        ``<role>-key.pem``): ``"client"``, ``"scheduler"`` or ``"worker"``.

    Returns
    -------
    distributed.Security or None
        Requiring encryption; None when no TLS flag is given (Dask's
        configuration decides).

    Raises
    ------
    CLIError
        One of the three files is missing or unreadable.
    """
    from distributed import Security

    ca, cert, key = args.tls_ca_file, args.tls_cert, args.tls_key
    if args.tls_dir:
        d = Path(args.tls_dir)
        ca, cert, key = ca or d / "ca.pem", cert or d / f"{role}.pem", key or d / f"{role}-key.pem"
    if not (ca or cert or key):
        return None
    missing = [str(p) for p in (ca, cert, key) if not p or not Path(p).is_file()]
    if missing:
        raise CLIError(f"TLS needs a CA file, a certificate and a key; missing or unreadable: {missing} "
                       "(--tls-dir DIR with ca.pem, client.pem, client-key.pem from cluster/tls/make_certs.py)")  # fmt: skip
    return Security(
        require_encryption=True, tls_ca_file=str(ca), **{f"tls_{role}_cert": str(cert), f"tls_{role}_key": str(key)}
    )


def local_security(tls_dir: str | Path | None) -> Security | None:
    """Security for all three roles of a local cluster from a make_certs.py folder.

    Parameters
    ----------
    tls_dir : str, pathlib.Path or None
        ``--tls-dir``: ``ca.pem`` and ``<role>.pem``/``<role>-key.pem`` for
        scheduler, worker and client.

    Returns
    -------
    distributed.Security or None
        Requiring encryption; None without a folder.

    Raises
    ------
    CLIError
        A file is missing from the folder.
    """
    from distributed import Security

    if not tls_dir:
        return None
    d = Path(tls_dir)
    files = {f"tls_{r}_{k}": d / f"{r}{'-key' if k == 'key' else ''}.pem" for r in ("scheduler", "worker", "client")
             for k in ("cert", "key")}  # fmt: skip
    files["tls_ca_file"] = d / "ca.pem"
    missing = sorted(str(p) for p in files.values() if not p.is_file())
    if missing:
        raise CLIError(f"--tls-dir {d} lacks {missing} (make them with cluster/tls/make_certs.py)")
    return Security(require_encryption=True, **{k: str(v) for k, v in files.items()})


def connect(args: argparse.Namespace) -> Client:
    """A Client for --scheduler / --scheduler-file (default: Dask's ``scheduler-address`` setting).

    Every way this fails (no address, TLS on one side only, nothing listening, a refused
    certificate) is a :class:`CLIError` saying what to do.

    Parameters
    ----------
    args : argparse.Namespace
        The connection options: ``scheduler``, ``scheduler_file``, the TLS
        flags (:func:`security_from_args`) and ``timeout`` (a Dask duration
        such as ``"10s"``).

    Returns
    -------
    distributed.Client
        Connected; use it as a context manager to close it.

    Raises
    ------
    CLIError
        As above.
    """
    import dask.config
    from dask.utils import parse_timedelta
    from distributed import Client

    sec = security_from_args(args)
    kw = {"timeout": args.timeout} if sec is None else {"timeout": args.timeout, "security": sec}
    if args.scheduler_file:
        if not Path(args.scheduler_file).is_file():
            raise CLIError(f"scheduler file {args.scheduler_file} does not exist: is the scheduler running, "
                           "and is the file on a filesystem this machine sees?")  # fmt: skip
        addr = json.loads(Path(args.scheduler_file).read_text()).get("address", "")
        target = {"scheduler_file": args.scheduler_file}
    else:
        addr = args.scheduler or dask.config.get("scheduler-address", None)
        if not addr:
            raise CLIError(
                "no scheduler given: pass --scheduler tls://HOST:8786 (or --scheduler-file), "
                "or set DASK_SCHEDULER_ADDRESS; `gear-flow local` starts one on this machine"
            )
        target = {"address": addr}
    tls_configured = sec is not None or dask.config.get("distributed.comm.tls.ca-file", None)
    if addr.startswith("tls://") and not tls_configured:
        raise CLIError(
            f"{addr} uses TLS: pass --tls-dir DIR (ca.pem, client.pem, client-key.pem) "
            "or --tls-ca-file/--tls-cert/--tls-key, or `source cluster/env.sh` with GEAR_FLOW_TLS_DIR set"
        )
    encrypted = sec.require_encryption if sec is not None else dask.config.get("distributed.comm.require-encryption")
    if addr and not addr.startswith("tls://") and encrypted:
        raise CLIError(
            f"{addr} is not a TLS address, but this shell requires encryption "
            "(DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION, set by `source cluster/env.sh` or --tls-dir): "
            f"use tls://{addr.split('://')[-1]} for a TLS cluster, or unset DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION "
            "for a plain-TCP one"
        )
    try:
        return Client(**target, **kw)
    except (OSError, TimeoutError) as e:
        hint = ("; with TLS, check that the certificates are signed by the cluster's CA" if addr.startswith("tls://")
                else "")  # fmt: skip
        try:  # the option's text may be a bare number, in seconds: say the unit
            waited = f"{parse_timedelta(args.timeout, default='s'):g} s"
        except (TypeError, ValueError):
            waited = str(args.timeout)
        raise CLIError(
            f"cannot reach the scheduler at {addr or args.scheduler_file} within {waited} "
            f"({first_line(e) or type(e).__name__}): is it running, and is the address right? "
            f"(--timeout to wait longer{hint})"
        ) from e


def table_names(client: Client) -> list[str]:
    """Names of the tables registered with the scheduler.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.

    Returns
    -------
    list of str
        Sorted; empty when gear_flow's coordinator is not set up there yet.

    Raises
    ------
    ProtocolError
        The scheduler runs another gear_flow protocol version.
    """

    from ..distributed.transport import CoordinatorClient
    from ..errors import ProtocolError

    try:
        return sorted(CoordinatorClient.of(client).list())
    except ProtocolError:  # another gear_flow version on the scheduler: say so
        raise
    except (KeyError, ValueError, AttributeError, TypeError):  # no coordinator handler yet: no tables
        return []


def attach(client: Client, name: str) -> DistributedTable:
    """Attach to the table ``name``.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.
    name : str
        The table's name.

    Returns
    -------
    DistributedTable
        A handle on the table, using ``client``.

    Raises
    ------
    CLIError
        No such table; the message lists the tables there are.
    """
    from ..distributed import DistributedTable

    names = table_names(client)
    if name not in names:
        there = f"tables there: {', '.join(names)}" if names else "there are no tables"
        raise CLIError(
            f"no table {name!r} on {client.scheduler.address} ({there}); create it with "
            f"`gear-flow create --name {name} ...`, or check --table"
        )
    return DistributedTable.attach(name, client=client)


def _add_connection(p) -> None:
    g = p.add_argument_group("connecting to a cluster")
    g.add_argument("--scheduler", metavar="ADDR", help="scheduler address, e.g. tls://10.0.0.5:8786 "
                   "(default: $DASK_SCHEDULER_ADDRESS / dask config scheduler-address)")  # fmt: skip
    g.add_argument(
        "--scheduler-file", metavar="FILE", help="scheduler file written by `dask scheduler --scheduler-file`"
    )
    g.add_argument(
        "--tls-dir", metavar="DIR", help="folder with ca.pem, client.pem, client-key.pem (cluster/tls/make_certs.py)"
    )
    g.add_argument("--tls-ca-file", metavar="FILE", help="CA certificate (overrides --tls-dir)")
    g.add_argument("--tls-cert", metavar="FILE", help="this client's certificate (overrides --tls-dir)")
    g.add_argument("--tls-key", metavar="FILE", help="this client's private key (overrides --tls-dir)")
    g.add_argument("--timeout", default="10s", help="how long to try connecting (default: %(default)s)")
