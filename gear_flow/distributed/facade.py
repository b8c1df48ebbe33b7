"""A facade's methods documented by the parts they hand their requests to: one text, in one place.

Both facades of the distributed layer use it: the worker's
:class:`~gear_flow.distributed.host.ShardHost` (its parts are classes) and the
client's :class:`~gear_flow.distributed.DistributedTable` (its parts are
functions over the handle).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["documented_as"]

_F = TypeVar("_F", bound=Callable[..., Any])


def documented_as(source: Callable) -> Callable[[_F], _F]:
    """A decorator giving a facade's method the docstring of the part's function it delegates to.

    Parameters
    ----------
    source : callable
        The part's function or method; its docstring documents the facade's
        method.

    Returns
    -------
    callable
        A decorator that sets the decorated function's ``__doc__`` to
        ``source``'s and returns that function.
    """

    def mark(f: _F) -> _F:
        f.__doc__ = source.__doc__
        return f

    return mark
