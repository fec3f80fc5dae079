"""`python -m impl.analysis [NOTEBOOK ...]`: rerun the notebooks, rewriting notebooks/figures/."""

import os
import sys
from pathlib import Path

from impl.analysis.figures import execute_notebooks

os.environ.setdefault("MPLBACKEND", "Agg")
execute_notebooks([Path(p).resolve() for p in sys.argv[1:]] or None)
