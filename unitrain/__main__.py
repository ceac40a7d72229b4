"""``python -m unitrain`` and the ``unitrain`` console script: one command, which ends alike."""

import os
import sys

from unitrain.host.processes import run_command


def _app() -> None:
    from unitrain.app import main  # imported once the console is guarded (run_command)

    main()


def main() -> None:
    # As `python -m unitrain` does: a user's model module in the current directory is found
    # (model.torch=mod:build) by the console script too.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    run_command(_app)


if __name__ == "__main__":
    main()
