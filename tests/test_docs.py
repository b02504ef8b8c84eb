"""The documentation stays true to the repository: its links resolve inside a clone, and the
glossary of metrics columns lists exactly the columns a training run writes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import ROOT, SMOKE

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GLOSSARY = ROOT / "docs" / "glossary.md"

FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target), with an optional <...> around the target and an optional title
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SKIPPED_SCHEMES = ("http://", "https://", "mailto:")


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    out, fenced = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m:
            fenced = None if fenced == m.group(1) else (fenced or m.group(1))
            continue
        if fenced is None:
            out.append(line)
    return out


def links(path: Path) -> list[str]:
    """Every link target of a Markdown file (inline links, images, reference definitions), code excluded."""
    found = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        line = CODE_SPAN.sub("", line)
        found += [m.group(1).strip("<>") for m in INLINE_LINK.finditer(line)]
        m = REF_DEF.match(line)
        if m:
            found.append(m.group(1).strip("<>"))
    return found


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: its text (links reduced to their text), lowercased, every
    character other than a letter, digit, space, '-' or '_' dropped, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file: one per ATX heading (repeats get -1, -2, ... as on GitHub),
    plus explicit <a name=...> / id=... anchors."""
    out, seen = set(), {}
    for line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if m:
            slug = github_anchor(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
        out.update(HTML_ANCHOR.findall(line))
    return out


def git_ignored(path: Path) -> bool:
    """Whether git ignores `path` (then a clone does not have it); False where git is not at hand."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return False
    return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT).returncode == 0


def broken_link(source: Path, target: str) -> str | None:
    """Why a link from `source` does not resolve inside the repository, or None where it does."""
    if target.lower().startswith(SKIPPED_SCHEMES):
        return None
    raw_path, _, anchor = target.partition("#")
    dest = (source.parent / unquote(raw_path)).resolve() if raw_path else source.resolve()
    try:
        dest.relative_to(ROOT.resolve())
    except ValueError:
        return "points outside the repository (a clone lacks it)"
    if not dest.exists():
        return "no such file"
    if git_ignored(dest):
        return "the file is ignored by git (a clone lacks it)"
    if anchor and dest.suffix.lower() == ".md" and unquote(anchor).lower() not in anchors(dest):
        return f"no heading with anchor #{anchor} in {dest.relative_to(ROOT.resolve())}"
    return None


def test_every_relative_link_in_readme_and_docs_resolves():
    # the anchor rule, on headings of the kinds the docs use
    assert github_anchor("Choices where the paper is silent") == "choices-where-the-paper-is-silent"
    assert github_anchor("The engine's distribution for centring") == "the-engines-distribution-for-centring"
    assert github_anchor("is_center") == "is_center"
    assert github_anchor("Sampler-side KL (`kl_sampler`)") == "sampler-side-kl-kl_sampler"
    assert github_anchor("See [the method](docs/method.md)") == "see-the-method"
    assert (ROOT / "docs" / "method.md").exists() and GLOSSARY.exists()
    broken = []
    for doc in DOCS:
        for target in links(doc):
            why = broken_link(doc, target)
            if why:
                broken.append(f"{doc.relative_to(ROOT)}: ({target}) {why}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def glossary_columns() -> set[str]:
    """The column names of the glossary's table: the backticked first cell of each row."""
    rows = [line for line in prose_lines(GLOSSARY.read_text(encoding="utf-8")) if line.lstrip().startswith("|")]
    assert len(rows) > 2, "docs/glossary.md has no table"
    names = []
    for row in rows[2:]:  # after the header and its separator
        first = row.strip().strip("|").split("|")[0].strip()
        m = re.fullmatch(r"`([A-Za-z0-9_]+)`", first)
        assert m, f"docs/glossary.md: a row whose first cell is not a backticked column name: {row}"
        names.append(m.group(1))
    assert len(names) == len(set(names)), "docs/glossary.md lists a column twice"
    return set(names)


@pytest.mark.slow
def test_glossary_lists_exactly_the_columns_a_run_writes(tiny_model_dir, tmp_path):
    """One real smoke cell (stale sampler, dlc, 4 steps: probes, evals, a resync check) and its
    metrics.parquet columns against the glossary, both ways."""
    import pandas as pd

    out = tmp_path / "cell"
    cmd = [sys.executable, "-m", "dlcrepro", "train", "--config", str(SMOKE), "--model-dir", str(tiny_model_dir),
           "--sampler", "stale", "--correction", "dlc", "--seed", "0", "--out", str(out), "--set", "train.steps=4"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    written = set(pd.read_parquet(out / "metrics.parquet").columns)
    documented = glossary_columns()
    assert documented == written, (
        f"docs/glossary.md lists columns no run writes: {sorted(documented - written)}; "
        f"a run writes columns the glossary lacks: {sorted(written - documented)}"
    )
