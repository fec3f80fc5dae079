"""Measurement analysis: what the notebooks, the figures and `make results` read and draw.

- `impl.analysis.figures`: loaders (`hotpath bench` JSON, asv results, py-spy profiles) and one
  `plot_*` per figure, `save()`, `execute_notebooks()`;
- `impl.analysis.steps`: the loadtest step reports (where each result's time went);
- `impl.analysis.results`: `make results` (`python -m impl.analysis.results`): the committed
  sample, the figures and the README's tables from one run.

`from impl import analysis; analysis.load_results()` reads the names of `figures` (the
notebooks' spelling), loaded on first use so that importing this package needs no matplotlib.
`python -m impl.analysis [NOTEBOOK ...]` reruns the notebooks.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """The loaders and figures of `impl.analysis.figures`, imported on first use."""
    if name.startswith("__"):
        raise AttributeError(name)
    figures = importlib.import_module("impl.analysis.figures")
    try:
        return getattr(figures, name)
    except AttributeError:
        raise AttributeError(f"module 'impl.analysis' has no attribute {name!r}") from None
