"""Serialising a ParsedTrace's core: the raw event table, links and attribution as Arrow files (their per-row
arrays and frames) and the rest (header, decode report, track names, rules) as JSON in ``meta.json``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profparse.cache.frames import read_frame, write_checked
from profparse.cache.keys import FORMAT_VERSION
from profparse.cache.sealed import CorruptEntry, json_digest

if TYPE_CHECKING:
    import pandas as pd

    from profparse.tables.parsed import ParsedTrace

CORE_FILES = ("events.arrow", "links.arrow", "links.threads.arrow", "attribution.arrow", "attribution.steps.arrow")


def arrays_frame(obj: Any) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, Any]]:
    """Split a dataclass into its per-row arrays (one frame), its DataFrames and its other (JSON) fields."""
    import numpy as np
    import pandas as pd

    arrays, frames, rest = {}, {}, {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, np.ndarray):
            arrays[f.name] = value
        elif isinstance(value, pd.DataFrame):
            frames[f.name] = value
        else:
            rest[f.name] = value
    return pd.DataFrame(arrays, copy=False), frames, rest  # views: no copy of the arrays


def write_core(folder: Path, parsed: ParsedTrace) -> dict[str, Any]:
    """Write a ParsedTrace's raw table, links and attribution into ``folder``; the JSON rest as a dict."""
    raw = parsed.raw
    link_arrays, link_frames, _ = arrays_frame(parsed.links)
    attr_arrays, attr_frames, attr_rest = arrays_frame(parsed.attribution)
    files = {
        "events.arrow": raw.events,
        "links.arrow": link_arrays,
        "links.threads.arrow": link_frames["threads"],
        "attribution.arrow": attr_arrays,
        "attribution.steps.arrow": attr_frames["steps"],
    }
    for name, frame in files.items():
        if not write_checked(folder / name, frame):
            raise CorruptEntry(f"{name} does not read back identical")
    attr_rest["rules"] = [dataclasses.asdict(r) for r in attr_rest["rules"]]
    return {
        "format": FORMAT_VERSION,
        "rows": len(raw.events),
        "files": {name: (folder / name).stat().st_size for name in files},
        "events_attrs": dict(raw.events.attrs),
        "header": raw.header,
        "report": dataclasses.asdict(raw.report),
        "process_names": list(raw.process_names.items()),
        "thread_names": [(p, t, v) for (p, t), v in raw.thread_names.items()],
        "pid_labels": list(raw.pid_labels.items()),
        "tid_labels": list(raw.tid_labels.items()),
        "attribution": attr_rest,
    }


def read_core(folder: Path, path: str) -> tuple[Any, Any, Any]:
    """(raw, links, attribution) of the entry in ``folder`` (``path``: the trace's path, as the caller named it);
    :class:`CorruptEntry` when it does not read back."""
    from profparse.stages.attribute import Attribution
    from profparse.stages.rules import StageRule
    from profparse.trace.events import RawTrace
    from profparse.trace.link import Links
    from profparse.trace.schema import DecodeReport

    meta = json.loads((folder / "meta.json").read_text())
    if not isinstance(meta, dict) or meta.pop("checksum", None) != json_digest(meta):
        raise CorruptEntry("meta.json does not match its checksum")
    if meta.get("format") != FORMAT_VERSION or meta.get("name") != folder.name:
        raise CorruptEntry("meta.json is not this entry's")
    for name, size in meta["files"].items():
        if name not in CORE_FILES or (folder / name).stat().st_size != size:
            raise CorruptEntry(f"{name} has the wrong size")
    frames = {name: read_frame(folder / name) for name in CORE_FILES}
    rows = meta["rows"]
    events = frames["events.arrow"]
    if len(events) != rows or len(frames["links.arrow"]) != rows or len(frames["attribution.arrow"]) != rows:
        raise CorruptEntry("row counts differ")
    events.attrs.update(meta["events_attrs"])
    report = DecodeReport(**{**meta["report"], "path": path})
    raw = RawTrace(
        path=path,
        events=events,
        header=meta["header"],
        report=report,
        process_names={int(k): v for k, v in meta["process_names"]},
        thread_names={(int(p), int(t)): v for p, t, v in meta["thread_names"]},
        pid_labels={int(k): v for k, v in meta["pid_labels"]},
        tid_labels={int(k): v for k, v in meta["tid_labels"]},
    )
    arrays = frames["links.arrow"]
    links = Links(**{c: arrays[c].to_numpy() for c in arrays.columns}, threads=frames["links.threads.arrow"])
    arrays = frames["attribution.arrow"]
    rest = meta["attribution"]
    rules = [StageRule(**{**r, "kinds": None if r["kinds"] is None else tuple(r["kinds"])}) for r in rest.pop("rules")]
    attribution = Attribution(
        **{c: arrays[c].to_numpy() for c in arrays.columns},
        **rest,
        rules=rules,
        steps=frames["attribution.steps.arrow"],
    )
    return raw, links, attribution
