"""Message-field checkers: small combinators that build the wire protocol's schemas.

Each checker takes one field's value and returns nothing, or raises ``_Bad``
saying what is allowed; :func:`gear_flow.distributed.protocol.check` adds the
operation and the field and turns it into a
:class:`~gear_flow.errors.ProtocolError`.  They live apart from the schemas in
:mod:`gear_flow.distributed.protocol` so that the schemas read as a list of
operations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

#: largest count a message may carry (items, batch sizes, seeds stay below 2**63)
MAX_COUNT = 1 << 40

#: a field checker: returns nothing, or raises ``_Bad`` saying what is allowed
Checker = Callable[[Any], None]


class _Bad(Exception):
    """Internal: ``what`` is allowed (the caller adds operation and field)."""


# -- field checkers: each returns nothing or raises _Bad(allowed) ----------------------------------------
def integer(lo: int = 0, hi: int = MAX_COUNT) -> Checker:
    """A checker for an integer (not a bool) in ``[lo, hi]``.

    Parameters
    ----------
    lo, hi : int
        Inclusive bounds (default ``[0, MAX_COUNT]``).

    Returns
    -------
    Checker
        Accepts Python and NumPy integers.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is an integer in ``[lo, hi]``.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
            raise _Bad(f"an integer in [{lo}, {hi}]")

    return check


def number(lo: float = 0.0, hi: float = math.inf, closed_hi: bool = True) -> Checker:
    """A checker for a finite real number (not a bool) in ``[lo, hi]`` (``[lo, hi)`` unless ``closed_hi``).

    Parameters
    ----------
    lo : float, default 0.0
        Inclusive lower bound.
    hi : float, default inf
        Upper bound.
    closed_hi : bool, default True
        Whether ``hi`` itself is allowed.

    Returns
    -------
    Checker
        Accepts Python and NumPy integers and floats; NaN and infinities
        are refused.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is a finite number in range.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise _Bad(f"a number in [{lo}, {hi}]")
        f = float(v)
        if not (math.isfinite(f) and lo <= f and (f <= hi if closed_hi else f < hi)):
            raise _Bad(f"a finite number in [{lo}, {hi}{']' if closed_hi else ')'}")

    return check


def text(max_len: int = 512) -> Checker:
    """A checker for a non-empty string of at most ``max_len`` characters.

    Parameters
    ----------
    max_len : int, default 512
        Longest allowed length.

    Returns
    -------
    Checker
        The checker.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is a non-empty ``str`` of at most ``max_len`` characters.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if not isinstance(v, str) or not 0 < len(v) <= max_len:
            raise _Bad(f"a non-empty string of at most {max_len} characters")

    return check


def boolean(v: Any) -> None:
    """Check that ``v`` is ``True`` or ``False`` (Python or NumPy bool).

    Parameters
    ----------
    v : object
        A field's value.

    Raises
    ------
    _Bad
        Anything else (0 and 1 included).
    """
    if not isinstance(v, (bool, np.bool_)):
        raise _Bad("True or False")


def choice(*values: str) -> Checker:
    """A checker for one of the strings ``values``.

    Parameters
    ----------
    *values : str
        The allowed strings.

    Returns
    -------
    Checker
        The checker.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is one of ``values``.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if not isinstance(v, str) or v not in values:
            raise _Bad(f"one of {list(values)}")

    return check


def optional(inner: Checker) -> Checker:
    """A checker that lets None (or an absent field) through and checks anything else with ``inner``.

    Parameters
    ----------
    inner : Checker
        Checks values that are not None.

    Returns
    -------
    Checker
        The checker.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is None or passes ``inner``.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if v is not None:
            inner(v)

    return check


def int_array(lo: int = -(1 << 62), hi: int = 1 << 62, max_len: int = MAX_COUNT) -> Checker:
    """A checker for a 1-d array (or list, tuple) of integers in ``[lo, hi]``.

    Parameters
    ----------
    lo, hi : int
        Inclusive bounds of every element (default ``[-2**62, 2**62]``).
    max_len : int, default MAX_COUNT
        Most elements allowed.

    Returns
    -------
    Checker
        Accepts any signed or unsigned integer dtype; an empty array passes.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is a 1-d integer array within the bounds.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        a = v if isinstance(v, np.ndarray) else None
        if a is None:
            if not isinstance(v, (list, tuple)):
                raise _Bad("an array of integers")
            try:
                a = np.asarray(v)
            except (TypeError, ValueError):
                raise _Bad("an array of integers") from None
        if a.ndim != 1 or len(a) > max_len or (len(a) and a.dtype.kind not in "iu"):
            raise _Bad("a 1-d array of integers")
        if len(a) and (int(a.min()) < lo or int(a.max()) > hi):
            raise _Bad(f"integers in [{lo}, {hi}]")

    return check


def float_array(v: Any) -> None:
    """Check that ``v`` is a 1-d array (or list, tuple) of finite numbers >= 0 (priorities).

    Parameters
    ----------
    v : object
        A field's value.

    Raises
    ------
    _Bad
        Not 1-d, not numeric, or an element that is negative, NaN or
        infinite.
    """
    a = np.asarray(v) if isinstance(v, (list, tuple, np.ndarray)) else None
    if a is None or a.ndim != 1 or (len(a) and a.dtype.kind not in "iuf"):
        raise _Bad("a 1-d array of numbers")
    if len(a) and not np.all(np.isfinite(a.astype(np.float64)) & (a >= 0)):
        raise _Bad("finite numbers >= 0")


def mapping(key: Checker, value: Checker, max_len: int = 4096) -> Checker:
    """A checker for a mapping of at most ``max_len`` entries whose keys pass ``key`` and values ``value``.

    Parameters
    ----------
    key : Checker
        Checks each key.
    value : Checker
        Checks each value.
    max_len : int, default 4096
        Most entries allowed.

    Returns
    -------
    Checker
        Its message names the first bad key or value.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is such a mapping.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if not isinstance(v, Mapping) or len(v) > max_len:
            raise _Bad("a mapping")
        for k, x in v.items():
            try:
                key(k)
            except _Bad as e:
                raise _Bad(f"a mapping whose keys are {e}") from None
            try:
                value(x)
            except _Bad as e:
                raise _Bad(f"a mapping whose values are {e} (key {k!r})") from None

    return check


def sequence(item: Checker, max_len: int = MAX_COUNT) -> Checker:
    """A checker for a list or tuple of at most ``max_len`` items, each passing ``item``.

    Parameters
    ----------
    item : Checker
        Checks each item.
    max_len : int, default MAX_COUNT
        Most items allowed.

    Returns
    -------
    Checker
        Its message names the first bad item's index.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is such a list.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if not isinstance(v, (list, tuple)) or len(v) > max_len:
            raise _Bad("a list")
        for i, x in enumerate(v):
            try:
                item(x)
            except _Bad as e:
                raise _Bad(f"a list of {e} (item {i})") from None

    return check


def anything(v: Any) -> None:
    """Accept any value (checked later by the host or the gate, which know the table's state).

    Parameters
    ----------
    v : object
        A field's value.
    """
    return None


def record(**fields: Checker) -> Checker:
    """A checker for a mapping with exactly these keys (``optional`` ones may be absent).

    Parameters
    ----------
    **fields : Checker
        A checker per allowed key; an absent key is checked as None.

    Returns
    -------
    Checker
        Refuses unknown keys.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is a mapping whose keys are among ``fields`` and whose values pass them.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if not isinstance(v, Mapping):
            raise _Bad(f"a mapping with keys {sorted(fields)}")
        unknown = sorted(set(v) - set(fields))
        if unknown:
            raise _Bad(f"a mapping with keys {sorted(fields)} (unknown: {unknown})")
        for k, f in fields.items():
            try:
                f(v.get(k))
            except _Bad as e:
                raise _Bad(f"a mapping whose {k!r} is {e}") from None

    return check
