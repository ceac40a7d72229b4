"""The slowest tests of one or more pytest JUnit XML reports: ``python3 scripts/slowest_tests.py 15 a.xml b.xml``
(.ci/run prints them after the suites; standard library only)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def main(argv: list[str]) -> int:
    count, files = int(argv[0]), argv[1:]
    cases = []
    for path in files:
        for case in ET.parse(path).getroot().iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time") or 0.0), name))
    for seconds, name in sorted(cases, reverse=True)[:count]:
        print(f"  {seconds:7.1f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
