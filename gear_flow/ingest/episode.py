"""One episode's arrays from a file → a checked episode; derived columns; low-level errors translated.

:func:`make_episode` validates the raw arrays a reader found and returns them
at their *native* precision (float64 stays float64), so that a table asking
for float64 columns gets the file's values exactly; :func:`canonical` casts to
the canonical float32 layout the public readers yield, and :func:`derive` adds
``rtg`` and ``timestep`` after the cast to the table's dtypes (so a round trip
through an export recomputes bit-identical values).  :func:`guard` turns every
h5py/pyarrow/OS failure into a :class:`~gear_flow.errors.DatasetError` naming
the file and the episode or rows.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ..errors import DatasetError, GearFlowError

#: observation-like roles: one column (``obs``) or one per Dict/Tuple leaf (``obs__<leaf>``)
OBS_ROLES = ("obs", "next_obs")
SEP = "__"


def return_to_go(reward: ArrayLike, gamma: float = 1.0, dtype: DTypeLike = np.float32) -> np.ndarray:
    """``rtg[t] = sum_{k >= t} gamma**(k - t) * reward[k]``, accumulated in float64, returned as ``dtype``.

    Parameters
    ----------
    reward : array_like
        One episode's rewards, ``[T]``.
    gamma : float, default 1.0
        Discount; 1.0 (undiscounted, as Decision Transformer uses) is a reversed cumulative sum.
    dtype : numpy dtype-like, default float32
        dtype of the result.

    Returns
    -------
    numpy.ndarray
        ``[T]`` return-to-go, in ``dtype``.
    """
    r = np.asarray(reward, dtype=np.float64)
    if gamma == 1.0:
        return np.cumsum(r[::-1])[::-1].astype(dtype)
    out = np.empty_like(r)
    acc = 0.0
    for t in range(len(r) - 1, -1, -1):  # a recurrence; T is an episode's length
        acc = r[t] + gamma * acc
        out[t] = acc
    return out.astype(dtype)


@contextmanager
def guard(path: str | os.PathLike[str], episode: int | str | None = None, what: str = "read") -> Iterator[None]:
    """Translate h5py/pyarrow/OS errors raised inside into a DatasetError naming ``path`` and ``episode``.

    A context manager; :class:`~gear_flow.errors.GearFlowError` passes through unchanged.

    Parameters
    ----------
    path : str or os.PathLike
        The file being read or written.
    episode : int, str or None, optional
        The episode (or rows) at stake; None for the whole file.
    what : str, default "read"
        Past participle for the message: the file "cannot be {what}".
    """
    try:
        yield
    except GearFlowError:  # already clear (and a DatasetError already names the file)
        raise
    except (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
        # h5py raises OSError/RuntimeError/KeyError for damaged files; pyarrow's ArrowException
        # derives from these builtins too (ArrowInvalid is a ValueError, ArrowIOError an OSError)
        raise DatasetError(path, episode, f"cannot be {what} ({type(e).__name__}: {e})") from None


def leaves(role: str, value: Any) -> dict[str, object]:
    """``{column: array}`` for an observation: itself, or one column per Dict/Tuple leaf (``obs__key__0``).

    Parameters
    ----------
    role : str
        Column prefix, ``"obs"`` or ``"next_obs"``.
    value : array_like, dict or tuple
        An observation array, or a Dict space's dict / Tuple space's tuple of
        them, nested to any depth.

    Returns
    -------
    dict of str to object
        Column name (``role``, or ``role__key__i`` for leaves) to the leaf as given.
    """
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(leaves(f"{role}{SEP}{k}", v))
        return out
    if isinstance(value, tuple):  # a Tuple space's value: one array per member
        out = {}
        for i, v in enumerate(value):
            out.update(leaves(f"{role}{SEP}{i}", v))
        return out
    return {role: value}


def is_obs_column(name: str) -> bool:
    """Is ``name`` an observation column (``obs``, ``next_obs`` or a leaf ``obs__<key>``)?

    Parameters
    ----------
    name : str
        A column name.

    Returns
    -------
    bool
        True for observation-like columns.
    """
    return any(name == r or name.startswith(r + SEP) for r in OBS_ROLES)


def flags(path: str | os.PathLike[str], episode: int | str | None, label: str, a: np.ndarray) -> np.ndarray:
    """End flags: bool, or integers/floats holding only 0 and 1 (old D4RL files store floats).

    Parameters
    ----------
    path : str or os.PathLike
        The file (for messages).
    episode : int, str or None
        The episode (for messages).
    label : str
        The flag's name in the file (``terminals``, ``truncations``...).
    a : numpy.ndarray
        The flags as stored.

    Returns
    -------
    numpy.ndarray
        bool, same shape as ``a``.

    Raises
    ------
    DatasetError
        ``a`` is not bool/numeric, or holds a value other than 0 and 1.
    """
    if a.dtype.kind == "b":
        return a.astype(np.bool_, copy=False)
    _kind_ok(path, episode, label, a, "iuf", "bool (or 0/1 numbers)")
    bad = np.flatnonzero((a != 0) & (a != 1))
    if len(bad):
        raise DatasetError(path, episode, f"{label}[{bad[0]}] = {a[bad[0]]!r}; end flags must be True/False (or 0/1)")
    return a != 0


def _kind_ok(path, episode, label, a: np.ndarray, kinds: str, what: str) -> None:
    if a.dtype.kind not in kinds:
        raise DatasetError(path, episode, f"{label!r} has dtype {a.dtype}; expected {what}")


def _array(path, episode, label, v) -> np.ndarray:
    try:
        return np.asarray(v)
    except (TypeError, ValueError) as e:
        raise DatasetError(path, episode, f"{label!r} cannot be read as an array ({e})") from None


def make_episode(
    path: str | os.PathLike[str],
    episode: int | str | None,
    *,
    obs: Any,
    action: ArrayLike,
    reward: ArrayLike,
    terminal: ArrayLike,
    truncated: ArrayLike,
    next_obs: Any = None,
    labels: Mapping[str, str] | None = None,
    final_obs: bool = False,
    want_next: bool = False,
    strict: bool = True,
) -> dict[str, np.ndarray]:
    """Validate one episode's raw arrays; return its columns at native precision.

    Parameters
    ----------
    path : str or os.PathLike
        The file (for messages).
    episode : int, str or None
        The episode's id in the file (for messages).
    obs : array_like, or dict/tuple tree of array_like
        Observations, ``[T, ...]`` (``[T + 1, ...]`` with ``final_obs``); a
        Dict/Tuple tree is flattened to ``obs__<key>`` columns; 1-d
        observations become ``[T, 1]``.
    action : array_like
        ``[T]`` integer (discrete) or ``[T, a]`` float (continuous) actions.
    reward : array_like
        ``[T]`` (or ``[T, 1]``) rewards; its length defines ``T``.
    terminal : array_like
        ``[T]`` terminated flags: bool or 0/1 numbers.
    truncated : array_like
        ``[T]`` truncated flags: bool or 0/1 numbers.
    next_obs : array_like or tree, optional
        The file's next observations, ``[T, ...]``, shaped as ``obs``; used
        only with ``want_next``.
    labels : mapping of str to str, optional
        The file's names for the roles ``obs``, ``action``, ``reward``,
        ``terminal``, ``truncated``, so that messages name what the user sees.
    final_obs : bool, default False
        ``obs`` holds ``T + 1`` rows (Minari stores the final observation).
    want_next : bool, default False
        Add ``next_obs`` column(s): from ``next_obs`` when given, else the row
        after (the final observation for the last step when ``final_obs``); a
        terminated episode's last next observation is zeros (never
        bootstrapped from); a truncated one without it is an error.
    strict : bool, default True
        Reject non-finite observations or rewards and end flags before the
        last step; False keeps them as given.

    Returns
    -------
    dict of str to numpy.ndarray
        ``obs`` column(s), ``action`` (integers as int64), ``reward``,
        ``done``, ``truncated`` (bool), and ``next_obs`` column(s) with
        ``want_next``; each contiguous, ``T`` rows, floats at the file's precision.

    Raises
    ------
    DatasetError
        Naming ``path`` and ``episode``: ragged or mis-shaped columns, wrong
        dtypes, an empty episode, or (``strict``) a non-finite value or early end flag.
    """
    lab = {"obs": "obs", "action": "action", "reward": "reward", "terminal": "terminal", "truncated": "truncated"}
    lab.update(labels or {})
    act = _array(path, episode, lab["action"], action)
    rew = _array(path, episode, lab["reward"], reward)
    term = _array(path, episode, lab["terminal"], terminal)
    trunc = _array(path, episode, lab["truncated"], truncated)
    obs_cols = {
        k: _array(path, episode, lab["obs"] + k[3:].replace(SEP, "/"), v) for k, v in leaves("obs", obs).items()
    }
    _kind_ok(path, episode, lab["action"], act, "biuf", "an integer (discrete) or float (continuous) dtype")
    _kind_ok(path, episode, lab["reward"], rew, "iuf", "a numeric dtype")
    for role, a in (("reward", rew), ("terminal", term), ("truncated", trunc)):
        if a.ndim == 2 and a.shape[1] == 1:  # (N, 1): d4rl's own reader squeezes these too
            a = a[:, 0]
        if a.ndim != 1:
            raise DatasetError(path, episode, f"{lab[role]!r} has shape {a.shape}; expected one value per step, (T,)")
        if role == "reward":
            rew = a
        elif role == "terminal":
            term = a
        else:
            trunc = a
    T = len(rew)
    want = {lab["action"]: (act, T), lab["terminal"]: (term, T), lab["truncated"]: (trunc, T)}
    for k, a in obs_cols.items():
        if a.ndim == 0:
            raise DatasetError(path, episode, "observations must have one row per step")
        if a.ndim == 1:  # scalar observations
            obs_cols[k] = a = a[:, None]
        want[lab["obs"] + k[3:].replace(SEP, "/")] = (a, T + 1 if final_obs else T)
    if act.ndim == 0:
        raise DatasetError(path, episode, "actions must have one row per step")
    for label, (a, n) in want.items():
        if len(a) != n:
            extra = " (T + 1: the final observation is stored)" if final_obs and n == T + 1 else ""
            raise DatasetError(
                path,
                episode,
                f"ragged columns: {label!r} has {len(a)} rows, {lab['reward']!r} has {T}; expected {n}{extra}",
            )
    if T == 0:
        raise DatasetError(path, episode, "the episode has no steps")
    for k, a in obs_cols.items():
        _kind_ok(path, episode, lab["obs"] + k[3:].replace(SEP, "/"), a, "biuf", "a numeric dtype")
    term = flags(path, episode, lab["terminal"], term)
    trunc = flags(path, episode, lab["truncated"], trunc)
    if strict:
        checks = [(lab["reward"], rew)] + [(lab["obs"] + k[3:].replace(SEP, "/"), a[:T]) for k, a in obs_cols.items()]
        for label, a in checks:
            if a.dtype.kind == "f":
                bad = np.flatnonzero(~np.isfinite(a.reshape(len(a), -1)).all(axis=1))
                if len(bad):
                    raise DatasetError(
                        path,
                        episode,
                        f"{label}[{bad[0]}] is not finite ({a[bad[0]]!r}); strict=True requires finite "
                        f"{label} (pass strict=False to keep them)",
                    )
        early = np.flatnonzero(term[:-1] | trunc[:-1])
        if len(early):
            raise DatasetError(
                path,
                episode,
                f"an end flag is set at step {early[0]}, before the episode's last step ({T - 1}); "
                "strict=True requires episodes to end only at their last step (pass strict=False to keep them)",
            )
    out = {k: np.ascontiguousarray(a[:T]) for k, a in obs_cols.items()}
    out["action"] = np.ascontiguousarray(act.astype(np.int64) if act.dtype.kind in "biu" else act)
    out["reward"] = np.ascontiguousarray(rew)
    out["done"] = np.ascontiguousarray(term)
    out["truncated"] = np.ascontiguousarray(trunc)
    if want_next:
        out.update(_next_obs(path, episode, obs_cols, next_obs, final_obs, T, bool(term[-1]), lab))
    return out


def _next_obs(path, episode, obs_cols, next_obs, final_obs, T, terminated, lab) -> dict:
    if next_obs is not None:
        given = {"next_" + k: _array(path, episode, "next_" + k, v) for k, v in leaves("obs", next_obs).items()}
        for k, a in given.items():
            a = a[:, None] if a.ndim == 1 else a
            if len(a) != T or a.shape[1:] != obs_cols[k[5:]].shape[1:]:
                raise DatasetError(
                    path, episode, f"{k!r} has shape {a.shape}; expected ({T}, *{obs_cols[k[5:]].shape[1:]})"
                )
            given[k] = np.ascontiguousarray(a)
        return given
    if not final_obs and not terminated:
        raise DatasetError(
            path,
            episode,
            "the episode is truncated and the file has no next observation for its last step; "
            "keep next observations only for files that store them (e.g. D4RL's 'next_observations', "
            "a mapped 'next_obs' column) or ingest without a next_obs column",
        )
    out = {}
    for k, a in obs_cols.items():
        nxt = np.empty((T, *a.shape[1:]), dtype=a.dtype)
        nxt[: T - 1] = a[1:T]
        nxt[T - 1] = a[T] if final_obs else 0  # terminated: zeros, never bootstrapped from
        out["next_" + k] = nxt
    return out


def canonical(ep: Mapping[str, np.ndarray], gamma: float) -> dict[str, np.ndarray]:
    """The public readers' layout: floats as float32, plus ``rtg`` and ``timestep``.

    Parameters
    ----------
    ep : mapping of str to numpy.ndarray
        An episode from :func:`make_episode`.
    gamma : float
        Discount of ``rtg``.

    Returns
    -------
    dict of str to numpy.ndarray
        A new dict: observation columns and float columns as float32, the
        others as they are, plus ``rtg`` (float32) and ``timestep`` (int64).
    """
    out = {}
    for k, a in ep.items():
        if is_obs_column(k):
            out[k] = np.ascontiguousarray(a, dtype=np.float32)
        elif a.dtype.kind == "f":
            out[k] = a.astype(np.float32)
        else:
            out[k] = a
    return derive(out, gamma, {"rtg", "timestep"})


def derive(
    ep: dict[str, np.ndarray], gamma: float, names: Collection[str], rtg_dtype: DTypeLike = np.float32
) -> dict[str, np.ndarray]:
    """Add the derived columns among ``names`` (``rtg`` from ``ep["reward"]`` as it is, ``timestep``).

    Parameters
    ----------
    ep : dict of str to numpy.ndarray
        An episode; updated in place.
    gamma : float
        Discount of ``rtg``.
    names : collection of str
        Which derived columns to add (``"rtg"``, ``"timestep"``; others are ignored).
    rtg_dtype : numpy dtype-like, default float32
        dtype of ``rtg``.

    Returns
    -------
    dict of str to numpy.ndarray
        ``ep`` itself, with ``rtg`` (``[T]`` in ``rtg_dtype``) and/or
        ``timestep`` (``[T]`` int64, ``0 .. T-1``) added.
    """
    T = len(ep["reward"]) if "reward" in ep else len(next(iter(ep.values())))
    if "rtg" in names:
        ep["rtg"] = return_to_go(ep["reward"], gamma, rtg_dtype)
    if "timestep" in names:
        ep["timestep"] = np.arange(T, dtype=np.int64)
    return ep
