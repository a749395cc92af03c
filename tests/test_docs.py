"""The documentation: every "ARCHITECTURE.md §n" the code cites is a section of
docs/ARCHITECTURE.md (and no code cites the old design brief, "DESIGN §n"); the README stays short
and its results table is rendered from docs/results/current.json, whose updates from benchmark JSON
are tested here; every relative link in the README and docs/ leads somewhere."""

import re
from pathlib import Path

from file_modules import load

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


def load_results_script():
    return load("scripts", "results_table")


def test_readme_is_short():
    """The README is a page a user reads in two minutes; the rest lives in docs/."""
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 150, f"README.md has {lines} lines: move detail to docs/"


def test_readme_results_table_is_rendered_from_current_json():
    rt = load_results_script()
    rows = rt.load()
    readme = (ROOT / "README.md").read_text()
    assert rt.between(readme, *rt.markers(rt.TABLE)) == rt.render_table(rows), \
        "README.md's results table differs from docs/results/current.json: run scripts/results_table.py"
    commands = (ROOT / "docs" / "results" / "README.md").read_text()
    assert rt.between(commands, *rt.markers(rt.COMMANDS)) == rt.render_commands(rows)


def test_current_figures_are_recorded():
    """Each current figure names its dated results file, and its ratio is its figures' ratio."""
    rows = load_results_script().load()
    assert rows
    for r in rows:
        source = ROOT / r["source"]
        assert source.parent == ROOT / "docs" / "results" and source.is_file(), r["source"]
        assert source.name.startswith(r["date"]), (r["date"], r["source"])
        assert r["command"] and r["metric"] and r["model"] and r["device"]
        if r["peer"] is not None:
            assert abs(r["ratio"] - r["vkrt"] / r["peer"]) <= 0.02 * r["ratio"], r


def _rows():
    base = dict(model="m", device="H200, GCN", unit="t/s", peer_name="llama.cpp", command="c",
                date="2026-12-01", source="docs/results/old.md")
    return [dict(base, metric="decode", vkrt=100.0, peer=80.0, ratio=1.25,
                 match={"model": "moe.gguf", "test": "tg128", "device": "H200", "polaris_class": True}),
            dict(base, metric="depth", vkrt=50.0, peer=50.0, ratio=1.0,
                 match={"model": "moe.gguf", "test": "tg128@d16384", "device": "H200", "polaris_class": True}),
            dict(base, metric="serve", vkrt=10.0, peer=5.0, ratio=2.0)]


def test_update_takes_peer_py_figures():
    rt = load_results_script()
    peer = {"device": "NVIDIA H200", "polaris_class": True, "rounds": 1, "rows": [
        {"model": "moe.gguf", "vkrt": {"tg128": 300.04, "tg128@d16384": 170.0, "host_ms_per_decode_step": 1.0},
         "llama.cpp": {"tg128": 220.0}, "ratio_vkrt_vs_llama": {"tg128": 1.36}}]}
    rows, kept = rt.update(_rows(), [peer], "docs/results/new.md", "2026-12-05")
    assert rows[0] | {"match": None} == _rows()[0] | dict(vkrt=300.0, peer=220.0, ratio=1.36, date="2026-12-05",
                                                         source="docs/results/new.md", match=None)
    assert rows[1:] == _rows()[1:], "a row without the peer's figure, or without a match, stays"
    assert kept == ["depth, m", "serve, m"]
    native = dict(peer, polaris_class=False)
    assert rt.update(_rows(), [native], "docs/results/new.md", "2026-12-05")[0] == _rows()
    elsewhere = dict(peer, device="AMD Radeon RX 580")
    assert rt.update(_rows(), [elsewhere], "docs/results/new.md", "2026-12-05")[0] == _rows()
    q8 = dict(peer, rows=[dict(peer["rows"][0], type_k="q8_0", type_v="q8_0")])
    assert rt.update(_rows(), [q8], "docs/results/new.md", "2026-12-05")[0] == _rows(), "an f16 row takes f16 runs"
    q8_row = [dict(_rows()[0], match=dict(_rows()[0]["match"], kv="q8_0/q8_0"))]
    assert rt.update(q8_row, [q8], "docs/results/new.md", "2026-12-05")[0][0]["vkrt"] == 300.0
    assert rt.update(q8_row, [peer], "docs/results/new.md", "2026-12-05")[0] == q8_row


def test_update_takes_llama_bench_records():
    """`vkrt bench -o json` and llama-bench's `-o json` records of the same model and test."""
    rt = load_results_script()
    record = dict(model_filename="/models/moe.gguf", n_prompt=0, n_gen=128, n_depth=16384, gpu_info="NVIDIA H200")
    ours = [dict(record, build_commit="vkrt", avg_ts=160.0)]
    theirs = [dict(record, build_commit="b10434", avg_ts=170.0, gpu_info="")]
    rows, kept = rt.update(_rows(), [ours, theirs], "docs/results/new.md", "2026-12-05")
    assert (rows[1]["vkrt"], rows[1]["peer"], rows[1]["ratio"], rows[1]["date"]) == (160.0, 170.0, 0.94, "2026-12-05")
    assert rows[0] == _rows()[0]
    assert rt.update(_rows(), [ours], "docs/results/new.md", "2026-12-05")[0] == _rows(), "no peer: unchanged"
    assert rt.test_name(512, 0, 0) == "pp512" and rt.test_name(0, 128, 4096) == "tg128@d4096"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_in_the_docs_lead_somewhere():
    """Every relative link of README.md and docs/ names a file that exists, and an anchor into a
    markdown file names one of its headings."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", dest.read_text(), re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken
