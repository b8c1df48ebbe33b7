"""A facade's methods documented by the parts they hand their requests to: one text, in one place.

Both facades of the distributed layer use it: the worker's
:class:`~gear_flow.distributed.host.ShardHost` (its parts are classes) and the
client's :class:`~gear_flow.distributed.DistributedTable` (its parts are
functions over the handle).
"""

from __future__ import annotations

import inspect
import re
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
        ``source``'s, less the parameters the facade's method does not take
        (a part's function is handed the handle first: the method is called
        on it), and returns that function.
    """

    def mark(f: _F) -> _F:
        f.__doc__ = _only_parameters(source.__doc__, set(inspect.signature(f).parameters) - {"self", "cls"})
        return f

    return mark


_ENTRY = re.compile(r"^(\s*)\**([A-Za-z_][A-Za-z0-9_]*)\s*(:.*)?$")


def _only_parameters(doc: str | None, names: set[str]) -> str | None:
    """``doc`` with the entries of its numpydoc ``Parameters`` section that name none of ``names`` removed."""
    if not doc:
        return doc
    lines = doc.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        if lines[i].strip() == "Parameters" and i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}:
            indent = len(lines[i]) - len(lines[i].lstrip())
            rule, entries = lines[i + 1], []
            i += 2
            keep = True
            while i < len(lines) and lines[i].strip():  # the section ends at its first blank line
                m = _ENTRY.match(lines[i])
                if m and len(m.group(1)) == indent:  # an entry's first line (its text is indented deeper)
                    keep = m.group(2) in names
                if keep:
                    entries.append(lines[i])
                i += 1
            if entries:
                out += [rule, *entries]
            else:  # no parameter left: no section (nor the blank line after it)
                out.pop()
                i += 1
            continue
        i += 1
    return "\n".join(out) + ("\n" if doc.endswith("\n") else "")
