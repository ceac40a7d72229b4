"""unitrain's benchmark harness: measured side by side, in one run, on this machine.

    python benchmarks/run.py [--quick] [--repeats N] [--out benchmarks/results]

The command line only: the harness is the package beside this file, benchmarks/harness/ (its
sections, and what a run keeps of earlier ones, are described in harness/cli.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a file, Python puts this folder first on sys.path; run otherwise (runpy.run_path, a
# debugger), the package beside it and benchmarks/plot.py must still be found.
HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
