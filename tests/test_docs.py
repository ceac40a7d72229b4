"""The documentation holds together: README.md is a short front door, every guide in docs/ is
linked from it, and every relative link in README.md, docs/*.md and benchmarks/README.md points
at a file or folder that exists."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(ROOT.glob("docs/*.md"))
PAGES = [ROOT / "README.md", *DOCS, ROOT / "benchmarks" / "README.md"]
# Relative link targets (as written, from the repository root) that may be missing: none.
ALLOWED_MISSING: list = []

# [text](target) and ![alt](target); the target ends at whitespace or ")" (a title may follow).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(page: Path) -> list:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    return LINK.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_exist(page):
    missing = []
    for target in links(page):
        if re.match(r"(https?|mailto):", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists() and os.path.relpath(path, ROOT) not in ALLOWED_MISSING:
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; keep it a front door (at most 300)"


def test_every_guide_is_linked_from_readme():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in links(ROOT / "README.md")}
    unlinked = [p.name for p in DOCS if p.resolve() not in linked and p.name != "architecture.md"]
    assert not unlinked, f"docs/ guides not linked from README.md: {unlinked}"
