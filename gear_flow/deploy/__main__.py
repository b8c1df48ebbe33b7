"""``python -m gear_flow.deploy --role scheduler|worker|client [--scheduler ADDR]``: launch settings.

Reads ``GEAR_FLOW_HOST``, ``GEAR_FLOW_INTERFACE``, ``GEAR_FLOW_DASHBOARD``, ``GEAR_FLOW_PROTOCOL``
and ``GEAR_FLOW_SCHEDULER_FILE`` and prints shell assignments for ``eval``:

- ``gf_listen``: the one address every listener of the process binds;
- ``gf_dashboard``: the HTTP server's address bound to it, empty for none;
- with ``GEAR_FLOW_PROTOCOL=ucx``, ``export`` lines of what UCX needs on this node
  (:func:`gear_flow.deploy.ucx.ucx_environment`).

A bad setting prints one line to stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ..errors import GearFlowError
from .net import environ, http_address, http_off, is_loopback, listen_host, scheduler_host
from .ucx import ucx_environment

#: what --dry-run prints for an address this machine cannot work out (an interface it lacks, a
#: scheduler name it cannot resolve): the command is meant for another node
UNKNOWN = "ADDRESS_OF_THIS_NODE"


def settings(
    role: str, scheduler: str | None = None, dry_run: bool = False
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(shell variables, variables to export, notes for stderr) for a scheduler, a worker or a client
    (``env.sh``: a client listens on nothing, it only needs the UCX variables)."""
    host, interface = environ("GEAR_FLOW_HOST"), environ("GEAR_FLOW_INTERFACE")
    if role == "client":
        target = scheduler_host(scheduler or environ("GEAR_FLOW_SCHEDULER_ADDRESS"))
        near = host or (target and is_loopback(target) and "127.0.0.1") or None
        return {}, ucx_environment(near) if environ("GEAR_FLOW_PROTOCOL") == "ucx" else {}, []
    notes = []
    try:
        listen = listen_host(role, host, interface, scheduler, environ("GEAR_FLOW_SCHEDULER_FILE"))
    except GearFlowError as e:
        if not dry_run:
            raise
        listen = UNKNOWN
        notes.append(f"dry run: {e}; the command shows {UNKNOWN} instead")
    if role == "scheduler" and not host and not interface:
        notes.append(
            "listening on 127.0.0.1 only (GEAR_FLOW_HOST is not set): other nodes cannot join; "
            "set GEAR_FLOW_HOST to this node's address (e.g. 10.0.0.5) to let them"
        )
    dash = environ("GEAR_FLOW_DASHBOARD")
    if role == "scheduler":
        dashboard = http_address(dash, listen, 8787)
    else:  # workers: a random port on the same address, or nothing
        http_address(dash, listen, 8787)  # (checked as the scheduler's is: a bad value is refused here too)
        dashboard = None if http_off(dash) else http_address(None, listen, 0)
    export = ucx_environment(listen) if environ("GEAR_FLOW_PROTOCOL") == "ucx" else {}
    return {"gf_listen": listen, "gf_dashboard": dashboard or ""}, export, notes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gear_flow.deploy", description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=["scheduler", "worker", "client"], required=True)
    p.add_argument("--scheduler", help="worker: the scheduler's address")
    p.add_argument("--dry-run", action="store_true", help="an address this node cannot tell is a placeholder")
    args = p.parse_args(argv)
    try:
        var, export, notes = settings(args.role, args.scheduler, args.dry_run)
    except GearFlowError as e:
        print(f"{'env.sh' if args.role == 'client' else f'start-{args.role}.sh'}: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"start-{args.role}.sh: {note}", file=sys.stderr)
    for k, v in var.items():
        print(f"{k}={shlex.quote(v)}")
    for k, v in export.items():
        print(f"export {k}={shlex.quote(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
