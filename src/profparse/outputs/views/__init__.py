"""One module per chart: ``KIND``, ``TITLE``, ``data(parsed) -> (prepared | None, why)``, ``draw(prepared)``.

``data`` builds the plot data from :class:`~profparse.api.ParsedTrace`'s public tables only (plain DataFrames,
dicts, arrays); ``draw`` turns it into a matplotlib figure (``profparse plot``; matplotlib is imported there, not
here), and ``profparse report`` renders the same data in the browser. Adding a view is its module plus one entry
in the tuple below; ``plot`` and ``report`` pick it up.
"""

from __future__ import annotations

from types import ModuleType

from profparse.outputs.views import (
    communication,
    critical_path,
    layers,
    load,
    memory,
    roofline,
    stages,
    timeline,
    top_kernels,
    top_ops,
    top_runtime,
)

#: The registry: kind -> view module, in the order plots are listed and report sections appear.
VIEWS: dict[str, ModuleType] = {
    m.KIND: m
    for m in (
        stages,
        timeline,
        critical_path,
        top_kernels,
        top_ops,
        top_runtime,
        communication,
        roofline,
        memory,
        layers,
        load,
    )
}
