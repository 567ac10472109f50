"""README.md and docs/ stay true: relative links and anchors resolve, the README stays short, every
docs file is reachable from it, and the generated config reference matches the schema."""
import re
from pathlib import Path

import pytest

from clipbert_legacy.config import REFERENCE_BEGIN, REFERENCE_END, config_reference_markdown
from clipbert_legacy.config import __main__ as config_main
from clipbert_legacy.config.reference import REFERENCE_PATH, update_reference

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_README_LINES = 350
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def prose_lines(text: str) -> list[str]:
    """Lines outside fenced code blocks (a ``# comment`` in a bash block is no heading)."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence:
            out.append(line)
    return out


def anchors(md: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to '-', '-N' for repeats."""
    seen: dict[str, int] = {}
    for line in prose_lines(md.read_text()):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            if n:
                seen[f"{slug}-{n}"] = 1
    return set(seen)


def broken_links(md: Path) -> list[str]:
    """Relative links of one markdown file whose file, or whose #anchor in a markdown file, is missing."""
    bad = []
    for target in LINK.findall("\n".join(prose_lines(md.read_text()))):  # link text may span lines
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            bad.append(f"{md.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{md.name}: {target} (no such heading)")
    return bad


def doc_files() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def test_relative_links_and_anchors_resolve():
    bad = [b for md in doc_files() for b in broken_links(md)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Scaling out (`x.py`)\n\n```bash\n# Not a heading\n```\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#scaling-out-xpy) [ok](#b) [gone](c.md) [bad](a.md#not-a-heading)\n"
        "[web](https://x.org) [two\nlines](d.md)\n# B\n")
    assert broken_links(tmp_path / "b.md") == [
        "b.md: c.md (no such file)", "b.md: a.md#not-a-heading (no such heading)",
        "b.md: d.md (no such file)"]


def test_readme_stays_short_and_links_every_docs_file():
    text = README.read_text()
    assert len(text.splitlines()) < MAX_README_LINES, "README.md is long: move detail into docs/"
    unlinked = [f.name for f in doc_files()[1:] if f"](docs/{f.name}" not in text]
    assert not unlinked, f"docs files the README does not link: {unlinked}"


def test_config_reference_is_generated():
    text = REFERENCE_PATH.read_text()
    section = text.split(REFERENCE_BEGIN, 1)[1].split(REFERENCE_END, 1)[0]
    assert section.strip() == config_reference_markdown().strip(), (
        "docs/config_reference.md is stale: run `.venv/bin/python -m clipbert_legacy.config --update-docs`")


@pytest.mark.parametrize("argv", [["--update-docs"], ["--update-readme", "README.md"]])
def test_update_flags_rewrite_the_reference_between_its_markers(tmp_path, monkeypatch, capsys, argv):
    stale = tmp_path / "config_reference.md"
    stale.write_text(f"# head\n{REFERENCE_BEGIN}\n| old |\n{REFERENCE_END}\ntail\n")
    monkeypatch.setattr(config_main, "REFERENCE_PATH", stale)
    config_main.main(argv)
    table = config_reference_markdown()
    assert stale.read_text() == f"# head\n{REFERENCE_BEGIN}\n{table}{REFERENCE_END}\ntail\n"
    out, err = capsys.readouterr()
    assert out.startswith("updated") and ("moved" in err) == (argv[0] == "--update-readme")
    assert update_reference(stale) is False  # up to date now
