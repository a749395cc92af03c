"""docs/ARCHITECTURE.md: every "ARCHITECTURE.md §n" the code cites is a section there, and no
code cites the old design brief ("DESIGN §n") instead."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cited_sections_exist():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", doc, re.M)}
    cited, stale = {}, []
    for folder in ("vkrt", "cli", "bench", "shaders"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".comp", ".glsl"):
                text, name = path.read_text(), str(path.relative_to(ROOT))
                for n in re.findall(r"ARCHITECTURE\.md §(\d+)", text):
                    cited.setdefault(int(n), []).append(name)
                if re.search(r"DESIGN §\d", text):
                    stale.append(name)
    assert cited, "the code cites no section"
    missing = {n: paths for n, paths in cited.items() if n not in sections}
    assert not missing, f"cited sections missing from docs/ARCHITECTURE.md: {missing}"
    assert not stale, f"cite docs/ARCHITECTURE.md, not DESIGN: {stale}"
