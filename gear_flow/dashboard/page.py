"""The Bokeh document of the ``/gear-flow`` dashboard page.

Built per browser session by Dask's Bokeh server on the scheduler, from the
snapshots :class:`~gear_flow.dashboard.plugin.GearFlowDashboard` polls; it
refreshes on the same period.  Three tables (tables, shards, learners) and,
for the table chosen in the selector, three time series: insert and sample
rates, size against ``max_size``, and samples per insert against the
limiter's target.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, DataTable, Div, Legend, Select, TableColumn
from bokeh.plotting import figure
from dask.utils import format_bytes

from .model import Snapshot

if TYPE_CHECKING:
    from bokeh.document import Document
    from distributed import Scheduler

    from .plugin import GearFlowDashboard

logger = logging.getLogger(__name__)

TABLE_COLUMNS = [
    ("table", "table"),
    ("state", "state"),
    ("size", "size"),
    ("max_size", "max size"),
    ("capacity", "capacity (steps)"),
    ("bytes_s", "stored"),
    ("resident_s", "resident"),
    ("disk_s", "on disk"),
    ("page_in_s", "page-in/s"),
    ("insert_rate", "inserts/s"),
    ("sample_rate", "samples/s"),
    ("limiter", "limiter"),
    ("blocked_inserts", "blocked inserts"),
    ("blocked_samples", "blocked samples"),
    ("spi_s", "samples/insert (target)"),
    ("evicted", "evicted"),
    ("stale_updates", "stale updates"),
    ("lost", "lost shards"),
]
SHARD_COLUMNS = [
    ("table", "table"),
    ("shard", "shard"),
    ("worker", "worker"),
    ("state", "state"),
    ("size", "size"),
    ("capacity", "capacity (steps)"),
    ("bytes_s", "stored"),
    ("insert_rate", "inserts/s"),
    ("sample_rate", "samples/s"),
    ("evicted", "evicted"),
    ("expired", "expired"),
    ("stale_updates", "stale updates"),
]
LEARNER_COLUMNS = [
    ("table", "table"),
    ("learner", "learner"),
    ("local_s", "shared memory / in-process"),
    ("remote_s", "Dask comm"),
    ("share_s", "local share"),
    ("batches", "batches"),
]


#: relative widths of the columns whose values are long (the others get 1)
WIDE = {"limiter": 2.2, "spi_s": 2.2, "worker": 2.0, "learner": 3.0, "local_s": 1.8}


def _columns(spec: list[tuple[str, str]]) -> list[TableColumn]:
    return [TableColumn(field=f, title=t, width=int(80 * WIDE.get(f, 1.0))) for f, t in spec]


def _empty(spec) -> dict:
    return {f: [] for f, _ in spec}


def table_data(snap: Snapshot, rate: dict[str, dict]) -> dict[str, list]:
    """Columns of the tables' DataTable from a snapshot and its rates.

    Parameters
    ----------
    snap : Snapshot
        The newest poll.
    rate : dict
        :func:`~gear_flow.dashboard.model.rates` of ``snap`` against the poll before.

    Returns
    -------
    dict of str to list
        One list per field of :data:`TABLE_COLUMNS`, one entry per table;
        byte counts formatted (``"1.2 GiB"``), rates in items/s to 0.1.
    """
    out = _empty(TABLE_COLUMNS)
    for name, r in snap.tables.items():
        ins, smp = rate["tables"].get(name, (0.0, 0.0))
        spi = f"{r['samples_per_insert']:.2f}"
        spi += f" ({r['target_spi']:g})" if r["target_spi"] is not None else " (none)"
        vals = {
            **r,
            "bytes_s": format_bytes(r["bytes"]),
            "resident_s": format_bytes(r["resident_bytes"]),
            "disk_s": format_bytes(r.get("disk_bytes", 0)),
            "page_in_s": format_bytes(int(rate.get("page_in", {}).get(name, 0.0))) + "/s",
            "insert_rate": round(ins, 1),
            "sample_rate": round(smp, 1),
            "spi_s": spi,
            "state": "closed, not dropped" if r.get("closed") else "open",
        }
        for f, _ in TABLE_COLUMNS:
            out[f].append(vals[f])
    return out


def shard_data(snap: Snapshot, rate: dict[str, dict]) -> dict[str, list]:
    """Columns of the shards' DataTable.

    Parameters
    ----------
    snap : Snapshot
        The newest poll.
    rate : dict
        :func:`~gear_flow.dashboard.model.rates` of ``snap`` against the poll before.

    Returns
    -------
    dict of str to list
        One list per field of :data:`SHARD_COLUMNS`, one entry per shard of every table.
    """
    out = _empty(SHARD_COLUMNS)
    for r in snap.shards:
        ins, smp = rate["shards"].get((r["table"], r["shard"]), (0.0, 0.0))
        vals = {**r, "bytes_s": format_bytes(r["bytes"]), "insert_rate": round(ins, 1), "sample_rate": round(smp, 1)}
        for f, _ in SHARD_COLUMNS:
            out[f].append(vals[f])
    return out


def learner_data(snap: Snapshot) -> dict[str, list]:
    """Columns of the learners' DataTable.

    Parameters
    ----------
    snap : Snapshot
        The newest poll.

    Returns
    -------
    dict of str to list
        One list per field of :data:`LEARNER_COLUMNS`, one entry per
        reporting learner; bytes formatted, the local share as a percentage.
    """
    out = _empty(LEARNER_COLUMNS)
    for r in snap.learners:
        vals = {
            **r,
            "local_s": format_bytes(r["local_bytes"]),
            "remote_s": format_bytes(r["remote_bytes"]),
            "share_s": f"{100 * r['local_share']:.0f}%",
        }
        for f, _ in LEARNER_COLUMNS:
            out[f].append(vals[f])
    return out


def series_data(history: Sequence[Snapshot], series: Sequence[dict], name: str | None) -> dict[str, list]:
    """Time series of one table: rates, size, samples per insert (ms since the epoch on x).

    Parameters
    ----------
    history : sequence of Snapshot
        The plugin's polls, oldest first.
    series : sequence of dict
        Their rates, aligned with ``history``.
    name : str or None
        The table to plot; None gives empty series.

    Returns
    -------
    dict of str to list
        ``time`` (ms since the epoch), ``inserts`` and ``samples`` (items/s),
        ``size``, ``max_size``, ``spi`` and ``target`` (NaN without a target);
        polls in which the table did not exist are skipped.
    """
    out = {k: [] for k in ("time", "inserts", "samples", "size", "max_size", "spi", "target")}
    if name is None:
        return out
    for snap, rate in zip(history, series):
        r = snap.tables.get(name)
        if r is None:
            continue
        ins, smp = rate["tables"].get(name, (0.0, 0.0))
        out["time"].append(snap.time * 1000)
        out["inserts"].append(ins)
        out["samples"].append(smp)
        out["size"].append(r["size"])
        out["max_size"].append(r["max_size"])
        out["spi"].append(r["samples_per_insert"])
        out["target"].append(r["target_spi"] if r["target_spi"] is not None else float("nan"))
    return out


def _figure(title: str, y: str, src, lines) -> figure:
    fig = figure(
        title=title, x_axis_type="datetime", height=240, sizing_mode="stretch_width", tools="", toolbar_location=None
    )
    items = []
    for field, label, color, dash in lines:
        r = fig.line("time", field, source=src, line_width=2, color=color, line_dash=dash)
        items.append((label, [r]))
    fig.add_layout(Legend(items=items, location="top_left"), "right")
    fig.yaxis.axis_label = y
    return fig


class GearFlowPage:
    """The widgets of one browser session and their refresh.

    Parameters
    ----------
    plugin : GearFlowDashboard
        The scheduler plugin whose ``history`` and ``series`` the page shows.
    """

    def __init__(self, plugin: GearFlowDashboard):
        self.plugin = plugin
        self.header = Div(text="<h2>gear_flow replay tables</h2><p>No table yet.</p>", sizing_mode="stretch_width")
        self.select = Select(title="Time series of table", options=[], value="", width=300)
        self.tables = ColumnDataSource(_empty(TABLE_COLUMNS))
        self.shards = ColumnDataSource(_empty(SHARD_COLUMNS))
        self.learners = ColumnDataSource(_empty(LEARNER_COLUMNS))
        self.series = ColumnDataSource(series_data([], [], None))
        grid = dict(sizing_mode="stretch_width", index_position=None)
        rates = _figure(
            "Insert and sample rates",
            "items/s",
            self.series,
            [("inserts", "inserts/s", "#1f77b4", "solid"), ("samples", "samples/s", "#ff7f0e", "solid")],
        )
        size = _figure(
            "Size",
            "items",
            self.series,
            [("size", "size", "#2ca02c", "solid"), ("max_size", "max size", "#7f7f7f", "dashed")],
        )
        spi = _figure(
            "Samples per insert",
            "samples / inserts",
            self.series,
            [("spi", "actual", "#9467bd", "solid"), ("target", "target", "#7f7f7f", "dashed")],
        )
        self.root = column(
            self.header,
            Div(text="<h3>Tables</h3>"),
            DataTable(source=self.tables, columns=_columns(TABLE_COLUMNS), height=130, **grid),
            Div(text="<h3>Shards</h3>"),
            DataTable(source=self.shards, columns=_columns(SHARD_COLUMNS), height=200, **grid),
            Div(text="<h3>Learners: where their bytes came from</h3>"),
            DataTable(source=self.learners, columns=_columns(LEARNER_COLUMNS), height=130, **grid),
            self.select,
            row(rates, size, spi, sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        )

    def update(self) -> None:
        """Show the newest snapshot."""
        hist = list(self.plugin.history)
        if not hist:
            return
        snap, rate = hist[-1], self.plugin.series[-1]
        names = sorted(snap.tables)
        self.select.options = names
        if self.select.value not in names:  # the fullest table first
            self.select.value = max(names, key=lambda n: (snap.tables[n]["size"], n)) if names else ""
        lost = sum(r["lost"] for r in snap.tables.values())
        closed = sum(1 for r in snap.tables.values() if r.get("closed"))
        summary = f"{len(names)} table(s), {len(snap.shards)} shard(s), {len(snap.learners)} learner(s) reporting" + (
            f", <b>{lost} shard(s) lost</b>" if lost else ""
        )
        if closed:
            summary += f", {closed} closed but not dropped (their data stays on the workers until dropped)"
        self.header.text = f"<h2>gear_flow replay tables</h2><p>{summary}</p>"
        self.tables.data = table_data(snap, rate)
        self.shards.data = shard_data(snap, rate)
        self.learners.data = learner_data(snap)
        self.series.data = series_data(hist, list(self.plugin.series), self.select.value or None)


def gear_flow_doc(plugin: GearFlowDashboard, scheduler: Scheduler, extra: dict, doc: Document) -> None:
    """Build the page for one browser session (Dask's ``BokehApplication`` calls this).

    Parameters
    ----------
    plugin : GearFlowDashboard
        The scheduler plugin holding the polls.
    scheduler : distributed.Scheduler
        The scheduler (part of the signature Dask's dashboard applications get; unused).
    extra : dict
        Template variables of the Dask dashboard (its navigation bar).
    doc : bokeh.document.Document
        The session's document; the page is added as its root and refreshed
        every ``plugin.interval`` seconds (at least 0.1 s).
    """
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    page = GearFlowPage(plugin)
    page.update()
    doc.title = "Dask: gear_flow"
    doc.add_root(page.root)
    doc.add_periodic_callback(page.update, max(100, int(plugin.interval * 1000)))
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME
