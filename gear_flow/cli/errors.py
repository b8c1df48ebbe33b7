"""The command line's errors: :class:`CLIError`, and :func:`explain`, one line for any failure."""

from __future__ import annotations

import errno

from ..errors import GearFlowError


class CLIError(GearFlowError):
    """A user error of the command line; the message says what is wrong and what to do."""


def first_line(e: BaseException) -> str:
    """An exception's message on one line (Dask's remote errors can carry several).

    Parameters
    ----------
    e : BaseException
        Any exception.

    Returns
    -------
    str
        ``str(e)`` with every run of whitespace, newlines included, made one space.
    """
    return " ".join(str(e).split())


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)


def explain(e: BaseException) -> str:
    """One line for a failed command: what, why, and what to do where we know it.

    Parameters
    ----------
    e : BaseException
        What the command raised (its cause chain is searched for known
        failures: a busy address, TLS required by configuration).

    Returns
    -------
    str
        The message :func:`~gear_flow.cli.main` prints after ``gear-flow COMMAND:``.
    """
    if isinstance(e, CLIError):  # ours already says all that
        return first_line(e)
    for x in _chain(e):
        if isinstance(x, OSError) and x.errno == errno.EADDRINUSE or "Address already in use" in str(x):
            return f"an address is already in use ({first_line(x)}): stop what listens there, or pick another port"
        if "encryption required by Dask configuration" in str(x):
            return (f"{first_line(x)}: this shell requires TLS (DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION, from "
                    "cluster/env.sh or --tls-dir): use the tls:// address, or unset that variable for a TCP cluster")  # fmt: skip
    if isinstance(e, GearFlowError):
        return f"{type(e).__name__}: {first_line(e)}"
    if isinstance(e, FileNotFoundError):
        return f"no such file or directory: {e.filename or first_line(e)}"
    if isinstance(e, (ValueError, OSError, TimeoutError)):
        return f"{type(e).__name__}: {first_line(e)}"
    return f"unexpected {type(e).__name__}: {first_line(e)} (rerun with --debug for the traceback)"
