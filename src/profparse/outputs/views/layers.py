"""Forward and backward time per module at the depth of the repeated layers (the analyses' ``modules`` table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from profparse.base.names import shorten_name
from profparse.outputs.views._common import (
    STAGE_COLORS,
    Figure,
    Prepared,
    optional_table,
    shade,
    time_unit,
    trace_title,
)

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

KIND = "layers"
TITLE = "Forward / backward per layer"
MAX_MODULES = 60


def layer_depth(table: pd.DataFrame) -> int:
    """The shallowest module depth where one class has several instances: the model's repeated blocks
    (``Qwen2DecoderLayer_0..N`` under ``Qwen2Model``, ResNet's ``layer1..4``)."""
    if "depth" not in table.columns or "class" not in table.columns:
        return -1
    per = table.drop_duplicates("module").groupby(["depth", "class"]).size()
    repeated = per[per >= 2]
    if len(repeated):
        return int(repeated.index.get_level_values(0).min())
    return int(per.idxmax()[0]) if len(per) else -1


def data(parsed: ParsedTrace) -> tuple[Prepared | None, str | None]:
    """Modules (rows, in first-seen order) x series (forward, backward, backward (recompute)) time in ns."""
    table = optional_table(parsed, "modules")
    if table is None:
        return None, "no nn.Module events (capture with with_stack=True or with_modules=True)"
    if "module" not in table.columns or "stage" not in table.columns:
        return None, f"modules table has no module/stage columns ({', '.join(map(str, table.columns))})"
    gpu = "gpu_ns" in table.columns and table["gpu_ns"].sum() > 0
    value = "gpu_ns" if gpu else next((c for c in ("host_ns", "time_ns", "dur_ns") if c in table.columns), None)
    if value is None:
        return None, "modules table has no time column"
    recomputed = table["recompute"].astype(bool) if "recompute" in table.columns else pd.Series(False, table.index)
    depth = layer_depth(table[~recomputed])
    if depth >= 0:
        # a recomputation (activation checkpointing) runs a layer from the autograd engine, with no parent: its rows
        # sit shallower than the layer's (a layer at depth 0, its Linear modules at the layers' depth), so they are
        # taken by the layers' names
        layers = table["depth"].eq(depth) & ~recomputed
        sub = table[layers | (recomputed & table["module"].isin(set(table.loc[layers, "module"])))]
    else:
        sub = table
    stage = sub["stage"].astype(str).where(~recomputed[sub.index], "backward (recompute)")
    sub = sub.assign(series=stage)
    series = [s for s in ("forward", "backward", "backward (recompute)") if (sub["series"] == s).any()]
    if not series:
        return None, "no forward or backward rows in the modules table"
    sub = sub[sub["series"].isin(series)]
    wide = sub.pivot_table(index="module", columns="series", values=value, aggfunc="sum", sort=False)
    wide = wide.reindex(columns=series).fillna(0).astype(float)
    if "first_ts_ns" in sub.columns:
        first = sub.groupby("module", sort=False)["first_ts_ns"].min()
        wide = wide.loc[first.reindex(wide.index).sort_values(kind="stable").index]
    hidden = 0
    if len(wide) > MAX_MODULES:
        hidden = len(wide) - MAX_MODULES
        keep = set(wide.sum(axis=1).sort_values(ascending=False).index[:MAX_MODULES])
        wide = wide.loc[[m for m in wide.index if m in keep]]
    wide.index = [str(i) for i in wide.index]
    what = "GPU time launched" if gpu else "host time"
    return {"title": trace_title(parsed), "wide": wide, "what": what, "depth": depth, "hidden": hidden}, None


def draw(prepared: Prepared) -> Figure:
    import matplotlib.pyplot as plt

    wide = prepared["wide"]
    series = list(wide.columns)
    scale, unit = time_unit(float(wide.to_numpy().max()))
    fig, ax = plt.subplots(figsize=(12, 1.8 + 0.32 * len(wide) * max(1, len(series) / 2)), layout="constrained")
    y = np.arange(len(wide))
    h = 0.8 / len(series)
    colors = {"forward": STAGE_COLORS["forward"], "backward": STAGE_COLORS["backward"]}
    right = float(wide.to_numpy().max()) / scale
    for j, name in enumerate(series):
        ys = y + (j - (len(series) - 1) / 2) * h
        values = wide[name].to_numpy(float) / scale
        ax.barh(
            ys,
            values,
            height=h,
            color=colors.get(name, shade(STAGE_COLORS["backward"], 0.45)),
            hatch="//" if "recompute" in name else "",
            edgecolor="white",
            linewidth=0.5,
            label=name,
        )
        for yi, v in zip(ys, values, strict=True):  # the number at the end of each bar
            if v > 0:
                ax.text(v + right * 0.01, yi, f"{v:,.2f}", va="center", fontsize=7)
    ax.set_xlim(0, right * 1.12 if right else 1)
    ax.set_yticks(y, [shorten_name(str(i), 44, kernel=False) for i in wide.index])
    ax.set_ylim(len(wide) - 0.5, -0.5)
    what = prepared["what"]
    ax.set_xlabel(f"{what} ({unit}), all steps")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(title="stage", loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    more = f" ({prepared['hidden']} smaller modules not shown)" if prepared["hidden"] else ""
    ax.set_title(f"Forward / backward {what} per module at depth {prepared['depth']}{more}: {prepared['title']}")
    return fig
