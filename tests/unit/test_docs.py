"""The README and docs/ hold together: every relative link leads to a file that
exists, and the README stays a front door (details belong in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
README_LIMIT_BYTES = 40_000


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_resolves() -> None:
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages()
        for target in LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://", "mailto:"))
        and not (page.parent / target).exists()
    ]
    assert not broken, broken


def test_the_readme_stays_a_front_door() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size < README_LIMIT_BYTES, f"README.md is {size} bytes: move details to docs/"
