"""The argparse commands' way in: bad arguments are one line, as every other refusal."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Bad arguments: one line and exit status 2, without argparse's usage block."""
        self.exit(2, f"{self.prog}: error: {message}\n")
