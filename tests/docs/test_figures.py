"""Figures in README.md and docs/ against their result files (scripts/results-index).

Fails when: README.md is longer than 1,000 words or an index of bench/results than 1,500, a
file under bench/results is missing from catalogue.toml (or the other way), a
chart or picture does not name the result file it was drawn from (or that file changed
since) and a picture in docs/ does not say it is simulated either,
an index of bench/results or a generated block differs from what the files give, a number
marked `<!-- figure FILE#KEY -->` differs from its file, README.md or a user-guide page
quotes a timing or rate that is neither generated nor marked, a catalogue commit is not
the commit git history gives for the file's content, or a quoted result file predates a
change to the code its benchmark measures that catalogue.toml does not explain. The git
checks skip where git or the history is missing (a tarball, a shallow clone).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    path = ROOT / "scripts" / "results-index"
    loader = importlib.machinery.SourceFileLoader("results_index", str(path))
    spec = importlib.util.spec_from_loader("results_index", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


ri = _load()

#: A timing, rate or ratio in prose: what must be generated or carry a figure marker
#: (a setting's default is written out: "60 seconds").
QUOTED = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|s|GB/s|×)(?![\w/])")
#: Pages for users (the design notes keep their history and name their files).
USER_PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def _needs_history(commit: str) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    if not ri.knows(ROOT, commit):
        pytest.skip(f"this checkout's history does not have {commit} (not a git clone, or shallow)")


def test_catalogue_and_files_agree() -> None:
    missing, gone = ri.unlisted(ROOT)
    assert missing == [], "add these to bench/results/catalogue.toml"
    assert gone == [], "these catalogue entries have no file"


def test_index_blocks_and_figures_match_their_files() -> None:
    assert ri.check(ROOT) == []


def test_user_pages_quote_only_generated_or_marked_figures() -> None:
    for page in USER_PAGES:
        text = ri.BLOCK.sub("", (ROOT / page).read_text())
        text = ri.FIGURE.sub("", text)
        text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        assert QUOTED.findall(text) == [], f"{page}: figures without their result file"


@pytest.mark.parametrize(("page", "limit"), [("README.md", 1000),
                                             ("bench/results/README.md", 1500),
                                             ("bench/results/logs/README.md", 1500)])
def test_pages_stay_short(page: str, limit: int) -> None:
    words = len((ROOT / page).read_text().split())
    assert words <= limit, f"{page}: {words} words, more than {limit}"


def _copy(tmp_path: Path) -> Path:
    """README.md, docs/ and bench/results in a tree of their own."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs",
                    ignore=shutil.ignore_patterns("_build", "*.png"))
    shutil.copytree(ROOT / "bench", tmp_path / "bench")
    return tmp_path


def test_a_value_changed_by_hand_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    assert ri.check(root) == []
    path = root / "bench/results/spill-cold-h200.json"
    document = json.loads(path.read_text())
    ri.lookup(document, "variants[cudask 3.73 GiB].measurements")["create"]["median"] = 1.25
    path.write_text(json.dumps(document, indent=1) + "\n")
    problems = ri.check(root)
    chart = ("bench/results/spill-cold-h200.png: bench/results/spill-cold-h200.json changed "
             "since this picture was drawn from it: redraw it")
    assert problems == [
        "README.md: a generated block differs from the files: run scripts/results-index", chart]
    ri.write_all(root)  # what the script does: the README then quotes the file again
    assert "| 1.25 s |" in (root / "README.md").read_text()
    assert ri.check(root) == [chart]  # until `scripts/results-index --charts` redraws it


def test_every_picture_names_its_source_file() -> None:
    charts = sorted((ROOT / "bench/results").rglob("*.png"))
    assert charts, "bench/results has charts"
    for path in charts:
        text = ri.pngtext.read(path.read_bytes())
        assert text[ri.SOURCE] == str(path.relative_to(ROOT).with_suffix(".json")), path
        assert text["Description"].startswith(f"result: {text[ri.SOURCE]}\n"), path
    assert [p for path in ri.pictures(ROOT) if (p := ri.check_picture(ROOT, path))] == []


def test_a_picture_without_its_source_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    chart = root / "bench/results/spill-cold-h200.png"
    data = chart.read_bytes()
    (root / "bench/results/spill-jit-h100.png").write_bytes(data)  # another file's chart
    plain = data[:8] + b"".join(  # the same pixels without text chunks
        c for c in _chunks(data) if c[4:8] not in (b"tEXt", b"iTXt", b"zTXt"))
    (root / "docs/picture.png").write_bytes(plain)
    (root / "docs/simulated.png").write_bytes(ri.pngtext.add(plain, {ri.SIMULATED: "made up"}))
    (root / "docs/replayed.png").write_bytes(ri.pngtext.add(plain, {
        ri.SOURCE: "bench/results/logs/nothing.json", ri.SHA256: "0" * 64}))
    assert ri.check(root) == [
        ("bench/results/spill-jit-h100.png: names 'bench/results/spill-cold-h200.json' as its "
         "source, not bench/results/spill-jit-h100.json: redraw it "
         "(scripts/results-index --charts)"),
        ("docs/picture.png: names no source result file and does not say it is simulated "
         "(draw it with scripts/dashboard-shot or cudask bench chart)"),
        ("docs/replayed.png: its source 'bench/results/logs/nothing.json' is not a file of "
         "bench/results/catalogue.toml"),
    ]


def _chunks(data: bytes) -> list[bytes]:
    """The chunks of a PNG, each whole (length, type, body, CRC)."""
    out, at = [], 8
    while at < len(data):
        length = int.from_bytes(data[at:at + 4], "big")
        out.append(data[at:at + 12 + length])
        at += 12 + length
    return out


def test_a_marked_figure_must_equal_its_file(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    key = "variants[backend=dask-cuda].measurements.read_verify.median"
    page = root / "docs" / "figure-check.md"
    value = ri.lookup(ri.load(root, "spill-cold-h200.json"), key)
    page.write_text(f"Read back in **{value:.2f} s**<!-- figure spill-cold-h200.json#{key} -->, "
                    f"{value * 1000:.1f} ms<!-- figure spill-cold-h200.json#{key} -->.\n")
    assert ri.check(root) == []
    wrong = f"{value + 0.15:.1f}"
    page.write_text(f"Read back in {wrong} s<!-- figure spill-cold-h200.json#{key} -->.\n")
    [said] = ri.check(root)
    assert said.startswith(f"docs/figure-check.md: {wrong} s (spill-cold-h200.json#{key}): "
                           "the file says ")
    page.write_text("In 1 s<!-- figure spill-cold-h200.json#variants[backend=none].x -->.\n")
    assert "cannot read the value" in ri.check(root)[0]


def test_a_marker_the_pattern_cannot_read_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    key = "variants[backend=dask-cuda].measurements.read_verify.median"
    page = root / "docs" / "figure-check.md"
    page.write_text(f"Read back in\n1.5<!-- figure\nspill-cold-h200.json#{key} --> s, and in "
                    f"about a second<!-- figure spill-cold-h200.json#{key} -->.\n")
    said = "a figure marker with no number right before it, or split over lines: it is not checked"
    assert ri.check(root) == [f"docs/figure-check.md:{line}: {said}" for line in (2, 3)]


def test_catalogue_commits_are_what_git_history_gives() -> None:
    catalogue = ri.catalogue(ROOT)["files"]
    _needs_history(next(e["commit"] for e in catalogue.values() if e.get("commit")))
    wrong = {}
    for name, entry in catalogue.items():
        if not entry.get("commit"):
            continue
        found = ri.content_commit(ROOT, name)
        if found is None or not found.startswith(entry["commit"][:7]):
            wrong[name] = (entry["commit"], found)
    assert wrong == {}, "catalogue commit != the commit that first wrote this content"


def test_quoted_results_are_newer_than_the_code_they_measure() -> None:
    quoted = ri.quoted(ROOT)
    assert "spill-cold-h200.json" in quoted  # the README's headline table
    catalogue = ri.catalogue(ROOT)["files"]
    for name in quoted:
        commit, _ = ri.commit_of(ROOT, name, catalogue.get(name, {}))
        _needs_history(commit.split()[0])
    stale = {name: ri.stale(ROOT, name) for name in quoted}
    assert {k: v for k, v in stale.items() if v} == {}, (
        "re-measure, stop quoting, or explain in bench/results/catalogue.toml [[unaffected]]")


def test_an_unexplained_change_makes_a_quoted_file_stale() -> None:
    _needs_history("2a3925e")
    # cupy figures are not covered by the spill A/B of the restructured memory core
    assert any(line.startswith("bf8c4b5") for line in ri.stale(ROOT, "cupy-cold-h100.json"))
    # and the pinning-ahead ramp changes the transfer runs' 30 GB limit (headroom 8 GiB)
    assert any(line.startswith("72b591f") for line in ri.stale(ROOT, "transfer-h200x2.json"))
    assert ri.stale(ROOT, "spill-cold-h200.json") == []


def test_an_entry_that_lists_files_explains_only_them() -> None:
    _needs_history("2a3925e")
    history = sys.modules["results_history"]
    cat = {"unaffected": [{"commits": ["2a3925e"], "benchmarks": ["spill"], "reason": "named",
                           "files": ["a.json"]}]}
    assert list(history.explained(ROOT, cat, "spill", "a.json").values()) == ["named"]
    assert history.explained(ROOT, cat, "spill", "b.json") == {}
    del cat["unaffected"][0]["files"]  # no list: every file of its benchmarks
    assert list(history.explained(ROOT, cat, "spill", "b.json").values()) == ["named"]


def test_a_bracketed_key_picks_a_mapping_entry_with_dots_in_its_name() -> None:
    document = {"results": {"cudask@memory.pinned-slab-size=1GiB": {"cold": {"total_s": 4.37}}},
                "variants": [{"name": "a.b", "x": 1}, {"backend": "none", "x": 2}]}
    assert ri.lookup(document, "results.[cudask@memory.pinned-slab-size=1GiB].cold.total_s") == 4.37
    assert ri.lookup(document, "variants[a.b].x") == 1  # a list: the item of that name
    assert ri.lookup(document, "variants[backend=none].x") == 2
