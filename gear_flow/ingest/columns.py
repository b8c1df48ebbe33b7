"""Column mapping for step tables written by other tools (Parquet): which column plays which role.

A :class:`ColumnMap` names, for a Parquet step table, the column of each role
the reader needs: ``obs`` (or several ``obs.<key>`` for a Dict observation),
``next_obs``, ``action``, ``reward``, ``terminal``, ``truncated``, plus the
episode and step columns.  ``truncated=None`` says the layout has no
truncation column: an episode whose last step is not terminal is then marked
truncated (it ended in the file without terminating).  :data:`LEROBOT` is
LeRobot's layout; :func:`parse_columns` reads the ``gear-flow ingest
--columns`` form.

Examples
--------
>>> m = ColumnMap({"observation.state": "obs", "next.reward": "reward", "next.done": "terminal"},
...               episode="episode_index", step="frame_index", truncated=None)
>>> m.source("obs"), m.source("action")
('observation.state', 'action')
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SpecError

#: roles a mapped column can play (``obs.<key>`` / ``next_obs.<key>``: one leaf of a Dict observation)
ROLES = ("obs", "next_obs", "action", "reward", "terminal", "truncated")


@dataclass(frozen=True)
class ColumnMap:
    """Which Parquet column holds which role.

    Parameters
    ----------
    columns : dict of str to str
        File column -> role (one of :data:`ROLES`, or ``obs.<key>`` /
        ``next_obs.<key>`` for a Dict observation).  Roles not named keep their
        default column (``obs`` or ``obs_0..``, ``action``, ``reward``,
        ``terminal``, ``truncated``).
    episode : str, default "episode_id"
        Integer column carrying each row's episode.
    step : str or None, default "step"
        Integer column ordering an episode's rows (``0 .. T-1``); None, or a
        column the file lacks: file order.
    truncated : str or None, default "truncated"
        The truncation flag's column; None: the layout has none.
    """

    columns: dict = field(default_factory=dict)
    episode: str = "episode_id"
    step: str | None = "step"
    truncated: str | None = "truncated"

    def __post_init__(self) -> None:
        if not isinstance(self.columns, dict):
            raise SpecError(
                f"ColumnMap.columns must be a dict of file column -> role, got {type(self.columns).__name__}"
            )
        for col, role in self.columns.items():
            if not isinstance(col, str) or not isinstance(role, str):
                raise SpecError(
                    f"ColumnMap.columns maps file column names to role names (str -> str), got {col!r}: {role!r}"
                )
            base = role.split(".", 1)[0]
            if base not in ROLES or (role.count(".") and base not in ("obs", "next_obs")):
                raise SpecError(f"column {col!r} is mapped to {role!r}; roles are {list(ROLES)} or obs.<key>")
            if role == "truncated" and self.truncated is None:
                raise SpecError(f"column {col!r} is mapped to 'truncated' but truncated=None says there is none")
        roles = list(self.columns.values())
        dup = sorted({r for r in roles if roles.count(r) > 1})
        if dup:
            raise SpecError(f"role(s) {dup} are mapped from more than one column")

    def source(self, role: str) -> str | None:
        """The file column of a role.

        Parameters
        ----------
        role : str
            One of :data:`ROLES` (or ``obs.<key>``).

        Returns
        -------
        str or None
            The mapped column, else the role's default column (its own name);
            None for ``truncated`` when the layout has no truncation column.
        """
        for col, r in self.columns.items():
            if r == role:
                return col
        if role == "truncated":
            return self.truncated
        return role

    def leaves(self, role: str) -> dict[str, str]:
        """The leaves of a Dict observation mapped from separate columns.

        Parameters
        ----------
        role : str
            ``"obs"`` or ``"next_obs"``.

        Returns
        -------
        dict of str to str
            ``{key: column}`` of the ``role.<key>`` mappings; empty if none.
        """
        return {r.split(".", 1)[1]: c for c, r in self.columns.items() if r.startswith(role + ".")}


#: LeRobot's Parquet layout (``data/chunk-000/episode_000000.parquet``, one or many episodes per file);
#: ``next.done`` marks an episode's last frame, with no separate truncation flag
LEROBOT = ColumnMap(
    {"observation.state": "obs", "action": "action", "next.reward": "reward", "next.done": "terminal"},
    episode="episode_index",
    step="frame_index",
    truncated=None,
)

#: named layouts for ``gear-flow ingest --layout``
LAYOUTS = {"gear-flow": ColumnMap(), "lerobot": LEROBOT}


def detect_layout(names: list[str]) -> tuple[ColumnMap, str]:
    """The layout of a Parquet step table read without ``columns=``, from its column names.

    Our own layout when it has our episode column; LeRobot's when it has
    ``episode_index`` and ``frame_index`` instead (unambiguous: no other
    layout has both); else ours, whose reader then names what is missing.

    Parameters
    ----------
    names : list of str
        The columns of the first file.

    Returns
    -------
    layout : ColumnMap
        The layout to read with.
    name : str
        Its name in :data:`LAYOUTS`.

    Examples
    --------
    >>> detect_layout(["episode_index", "frame_index", "observation.state", "action"])[1]
    'lerobot'
    """
    ours = LAYOUTS["gear-flow"]
    if ours.episode not in names and {LEROBOT.episode, LEROBOT.step} <= set(names):
        return LEROBOT, "lerobot"
    return ours, "gear-flow"


def parse_columns(
    text: str | None = None,
    *,
    layout: str | None = None,
    episode: str | None = None,
    step: str | None = None,
    no_truncation: bool = False,
) -> ColumnMap | None:
    """A ColumnMap from the ``gear-flow ingest`` options.

    Parameters
    ----------
    text : str, optional
        ``--columns``: comma-separated ``COLUMN=ROLE`` items
        (``"observation.state=obs,next.reward=reward"``), added to (and for the
        same role replacing) the layout's mappings.
    layout : str, optional
        ``--layout``: a name in :data:`LAYOUTS` to start from (default ``"gear-flow"``).
    episode : str, optional
        ``--episode-column``: overrides the layout's episode column.
    step : str, optional
        ``--step-column``: overrides the layout's step column.
    no_truncation : bool, default False
        ``--no-truncation-column``: the layout has no truncation column.

    Returns
    -------
    ColumnMap or None
        None when no option is set (the reader's default layout applies).

    Raises
    ------
    SpecError
        An unknown layout, a malformed item, or a mapping :class:`ColumnMap` rejects.
    """
    if text is None and layout is None and episode is None and step is None and not no_truncation:
        return None
    if layout is not None and layout not in LAYOUTS:
        raise SpecError(f"layout {layout!r} must be one of {sorted(LAYOUTS)}")
    base = LAYOUTS[layout or "gear-flow"]
    given = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        col, sep, role = item.rpartition("=")
        if not sep or not col:
            raise SpecError(f"--columns item {item!r} must be COLUMN=ROLE (e.g. observation.state=obs)")
        given = {c: r for c, r in given.items() if r != role.strip()}
        given[col.strip()] = role.strip()
    return with_columns(base, given, episode=episode, step=step, truncated=None if no_truncation else base.truncated)


def with_columns(
    base: ColumnMap, columns: dict, *, episode: str | None = None, step: str | None = None, truncated: object = ...
) -> ColumnMap:
    """``base`` with ``columns`` added, each replacing ``base``'s mapping of the same role.

    Parameters
    ----------
    base : ColumnMap
        A layout.
    columns : dict of str to str
        File column -> role.
    episode, step : str, optional
        Replace ``base``'s episode and step columns.
    truncated : str or None, optional
        Replaces ``base``'s truncation column (None: there is none).

    Returns
    -------
    ColumnMap
        The merged layout.

    Examples
    --------
    >>> with_columns(LEROBOT, {"observation.images.top": "obs"}).source("obs")
    'observation.images.top'
    """
    roles = set(columns.values())
    return ColumnMap(
        {**{c: r for c, r in base.columns.items() if r not in roles}, **columns},
        episode=episode or base.episode,
        step=step or base.step,
        truncated=base.truncated if truncated is ... else truncated,
    )
