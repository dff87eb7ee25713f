"""Pictures of a parsed trace: one figure per kind, PNG and SVG, one colour per stage everywhere.

Kinds (:data:`PLOT_KINDS`): the views of :mod:`profparse.outputs.views`, in its :data:`~profparse.outputs.views.KINDS`
order; each view module's docstring says what it draws.

A kind whose data is absent (no GPU, no ``[memory]`` events, a table not computed) is skipped with a reason. All
views only read the :class:`~profparse.api.ParsedTrace`; matplotlib runs on the Agg backend.

Each kind is a module of :mod:`profparse.outputs.views` (its data and its drawing); this module only turns the
registry into files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profparse.base.files import atomic_dir
from profparse.outputs.views import KINDS, give_back, release_order, views
from profparse.outputs.views._common import STAGE_COLORS, Figure, optional_table, style, time_unit, timeline_intervals
from profparse.outputs.views.stages import level_panels

if TYPE_CHECKING:
    from profparse.tables.parsed import ParsedTrace

PLOT_KINDS: tuple[str, ...] = KINDS
FORMATS: tuple[str, ...] = ("png", "svg")
MAX_RECTS = 6000  # timeline intervals drawn, all tracks together
#: PNG pixels per figure: a tall figure (the top lists of many stages) at a high dpi would otherwise take
#: gigabytes and minutes to render and compress (top_ops at --dpi 1000: 12116 x 16626 pixels); a figure over
#: it is drawn at the highest dpi that fits, with a note
MAX_PIXELS = 16_000_000

__all__ = ["FORMATS", "PLOT_KINDS", "STAGE_COLORS", "PlotResult", "make_figure", "optional_table", "write_plots"]
__all__ += ["save_figure", "time_unit"]


def _timeline_intervals(parsed: ParsedTrace) -> tuple[Any, int]:
    """The timeline's aggregated intervals at this module's :data:`MAX_RECTS`."""
    return timeline_intervals(parsed, MAX_RECTS)


_level_panels = level_panels  # the stages plot's panels (tests compare them with the summary)


@dataclass
class PlotResult:
    """What one kind produced: its files, or why it was skipped; ``note``: the PNG was drawn at a lower dpi."""

    kind: str
    files: list[Path] = field(default_factory=list)
    skipped: str | None = None
    note: str | None = None


def make_figure(parsed: ParsedTrace, kind: str) -> tuple[Figure | None, str | None]:
    """Build one figure (Agg backend); returns (figure, None) or (None, why it was skipped)."""
    if kind not in KINDS:
        raise ValueError(f"unknown plot kind {kind!r}; expected one of {', '.join(PLOT_KINDS)}")
    prepared, why = views()[kind].data(parsed)
    if prepared is None:
        return None, why
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    with plt.rc_context(style()):
        return views()[kind].draw(prepared), None


def png_dpi(fig: Figure, dpi: int, max_pixels: int = MAX_PIXELS) -> int:
    """``dpi``, or the highest dpi at which ``fig`` stays within ``max_pixels`` (never below 1)."""
    width, height = fig.get_size_inches()
    fits = int(math.sqrt(max_pixels / max(width * height, 1e-9)))
    return max(1, min(dpi, fits))


def save_figure(
    fig: Figure, base: Path, formats: Sequence[str] = FORMATS, dpi: int = 120, notes: list[str] | None = None
) -> list[Path]:
    """Write ``fig`` as ``base.<fmt>`` for each format; a PNG over :data:`MAX_PIXELS` at ``dpi`` is drawn at the
    highest dpi that fits, and ``notes`` gets a line saying so."""
    import matplotlib.pyplot as plt

    paths = []
    try:
        with plt.rc_context(style()):
            for fmt in formats:
                path = base.with_suffix(f".{fmt}")
                used = png_dpi(fig, dpi) if fmt == "png" else dpi
                if used < dpi and notes is not None:
                    notes.append(
                        f"{path.name}: drawn at {used} dpi, not {dpi} (a PNG is at most {MAX_PIXELS / 1e6:.0f} Mpixel)"
                    )
                fig.savefig(path, format=fmt, dpi=used, bbox_inches="tight", facecolor="white")
                paths.append(path)
    finally:
        plt.close(fig)
    return paths


def write_plots(
    parsed: ParsedTrace,
    out_dir: str | Path,
    *,
    kinds: Sequence[str] | None = None,
    formats: Sequence[str] = FORMATS,
    force: bool = False,
    dpi: int = 120,
    release: bool = False,
) -> list[PlotResult]:
    """Write ``<kind>.png`` / ``<kind>.svg`` for each kind into ``out_dir`` (created atomically). ``release``: what
    only one view reads is given back once its figure is drawn, unless held before (``plot``, which parses for
    the figures alone), and the figures are drawn in :func:`~profparse.outputs.views.release_order`."""
    kinds = list(kinds) if kinds else list(PLOT_KINDS)
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown plot kind {kind!r}; expected one of {', '.join(PLOT_KINDS)}")
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    results = {}
    held = parsed.computed()
    target = Path(out_dir)
    owns = [f"{kind}.{fmt}" for kind in kinds for fmt in formats]  # --kind X --force replaces only X's files
    with atomic_dir(target, force=force, verb="plot", inputs=[parsed.path], owns=owns) as tmp:
        for kind in release_order(kinds) if release else kinds:
            fig, why = make_figure(parsed, kind)
            if fig is None:
                results[kind] = PlotResult(kind, skipped=why)
            else:
                notes: list[str] = []
                files = save_figure(fig, tmp / kind, formats, dpi, notes)
                results[kind] = PlotResult(kind, files=[target / f.name for f in files], note="; ".join(notes) or None)
            if release:
                give_back(parsed, kind, held)
    return [results[kind] for kind in kinds]
