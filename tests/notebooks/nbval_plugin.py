"""nbval settings for the notebooks, and the entry point that runs nbval.

`test_notebooks.py` runs this file as a script in a child process,
`python nbval_plugin.py NOTEBOOK [pytest args]`, and the script hands itself
to pytest as a plugin. A child process keeps nbval's kernels, the notebooks'
rank processes and nbval's collection out of the outer pytest session, and
passing the plugin object (not `-p name`) keeps `PYTHONPATH` (which the
kernels would inherit) untouched.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import pytest

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# Output keys nbval never compares, on top of its own list (which already has
# the widget view JSON, whose model ids are random, and png/jpeg):
# - text/html, javascript, svg: embed random element ids and library versions;
# - plotly JSON: figures of measured runs (times, bucket timings) differ on
#   every run; figures are checked through `figure_*().to_dict()` in unit tests
#   and their rendering in tests/browser;
# - stderr: torch and gloo warnings depend on the version and the machine.
EXTRA_SKIP_COMPARE = (
    "text/html",
    "application/javascript",
    "image/svg+xml",
    "application/vnd.plotly.v1+json",
    "stderr",
)


def pytest_collectstart(collector: pytest.Collector) -> None:
    """Extend the skip list of every notebook nbval collects."""
    if hasattr(collector, "skip_compare"):
        collector.skip_compare = (*collector.skip_compare, *EXTRA_SKIP_COMPARE)


def _widget_outputs_by_class(outputs: list[Any]) -> list[Any]:
    """Replace a widget output's text/plain fallback by the widget's class name.

    A FigureWidget's fallback repr holds the whole figure, measured numbers
    included, so comparing it is as flaky as comparing the plot. The class
    name keeps the check that the same kind of widget was displayed.
    """
    result = []
    for output in outputs:
        data = output.get("data") if hasattr(output, "get") else None
        if data and WIDGET_VIEW in data and "text/plain" in data:
            output = copy.deepcopy(output)
            text = output["data"]["text/plain"]
            output["data"]["text/plain"] = text.split("(", 1)[0].strip()
        result.append(output)
    return result


def pytest_itemcollected(item: pytest.Item) -> None:
    compare: Callable[..., bool] | None = getattr(item, "compare_outputs", None)
    if compare is None:
        return

    def compare_widgets_by_class(test: list[Any], ref: list[Any], *args: Any) -> bool:
        return compare(_widget_outputs_by_class(test), _widget_outputs_by_class(ref), *args)

    item.compare_outputs = compare_widgets_by_class  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(pytest.main(sys.argv[1:], plugins=[sys.modules[__name__]]))
