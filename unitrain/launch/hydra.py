"""Every Hydra command's way in: overrides checked in one line before Hydra composes anything."""

from __future__ import annotations

import sys
from importlib import resources
from typing import Callable, Dict, List

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from unitrain.launch import preflight


def group_options() -> Dict[str, List[str]]:
    """The options of each config group, read from the packaged conf/ directory."""
    conf = resources.files("unitrain.conf")
    return {
        group.name: sorted(f.name[: -len(".yaml")] for f in group.iterdir() if f.name.endswith(".yaml"))
        for group in conf.iterdir()
        if group.is_dir() and not group.name.startswith("_")
    }


def check_group_choices(args: List[str]) -> str | None:
    """A one-line message for ``group=option`` overrides naming an option that does not exist.

    Hydra would reject them too, but over a dozen lines with its search path; this names the
    key and the allowed options on one line. Everything else is left to Hydra.
    """
    overrides = [a for a in args if not a.startswith("-") and "=" in a]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return None  # Hydra reports syntax errors itself.
    options = group_options()
    for override in parsed:
        group = override.key_or_group.lstrip("+~")
        if group not in options or override.package is not None:
            continue
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        for value in values:
            if value is not None and str(value) not in options[group]:
                return f"{group}={value!r} is not allowed: one of {', '.join(options[group])}"
    return None


def hydra_entry(prog: str, hydra_main: Callable[[], None], config_name: str = "config") -> None:
    """Reject bad overrides and a run directory holding earlier results in one line, then hand
    the command line to Hydra."""
    args = sys.argv[1:]
    problem = check_group_choices(args)
    if not problem and not preflight.quick_flags(args):
        try:
            preflight.check(args, "unitrain.conf", config_name)
        except preflight.PreflightError as err:
            problem = str(err)
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    try:
        hydra_main()
    except KeyboardInterrupt:
        print(f"{prog}: error: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(130)
