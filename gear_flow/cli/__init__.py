"""Command line: ``gear-flow`` (also ``python -m gear_flow`` and ``dask gear-flow``).

    gear-flow local --workers 2
    gear-flow create --scheduler tcp://127.0.0.1:8786 --name replay --obs-dim 4 --capacity 100000
    gear-flow ingest --scheduler tcp://127.0.0.1:8786 --table replay data/cartpole/minari/cartpole-mixed-v0
    gear-flow info --scheduler tcp://127.0.0.1:8786 --table replay

Run ``gear-flow COMMAND --help`` for each command.  A user error prints one line on stderr (what went
wrong, why, what to do) and exits with status 2; ``--debug`` (or ``GEAR_FLOW_DEBUG=1``) shows the
traceback instead.
"""

from __future__ import annotations

import logging
import os
import sys

from .errors import CLIError, explain
from .parser import QUICKSTART, build_parser
from .text import format_info, format_rows, load_table_file, parse_columns, parse_kind

__all__ = [
    "CLIError",
    "QUICKSTART",
    "build_parser",
    "dask_command",
    "explain",
    "format_info",
    "format_rows",
    "load_table_file",
    "main",
    "parse_columns",
    "parse_kind",
]


def main(argv: list[str] | None = None) -> int:
    """Run one ``gear-flow`` command (the console script's entry point).

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: the command's own, 2 for a failure (one line on
        stderr, or the traceback with ``--debug`` / ``GEAR_FLOW_DEBUG=1``),
        130 when interrupted.
    """
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest:
        # argparse fills bench's "*" positional (empty) together with the one before it, so what follows a
        # `--` placed after an option (`bench distributed --full -- --repeat 10`) is left over: it is the extra
        if getattr(args, "cmd", None) == "bench" and rest[0] == "--":
            args.extra = [*args.extra, *rest[1:]]
        else:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    debug = args.debug or os.environ.get("GEAR_FLOW_DEBUG", "") not in ("", "0")
    if not debug and args.cmd != "local":
        # distributed logs connection trouble as multi-line warnings; the error below says it in one
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"gear-flow {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            raise
        print(f"gear-flow {args.cmd}: {explain(e)}", file=sys.stderr)
        return 2


def _dask_command():
    """``dask gear-flow ...`` (entry point group ``dask_cli``, as dask-cuda's ``dask cuda``)."""
    import click

    @click.command(name="gear-flow", add_help_option=False,
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})  # fmt: skip
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def gear_flow(args):
        """gear_flow replay tables on Dask (same as `gear-flow`; try `dask gear-flow --help`)."""
        sys.exit(main(list(args)))

    return gear_flow


try:
    dask_command = _dask_command()
except ImportError:  # click comes with distributed; without it there is no `dask` command either
    dask_command = None


if __name__ == "__main__":
    sys.exit(main())
