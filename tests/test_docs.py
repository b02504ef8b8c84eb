"""The documentation stays true to the repository: its links resolve inside a clone, the README
stays a front door (at most 200 lines, every docs page linked and saying what it answers), its
findings count and table are what paper_tables/findings.csv gives (one count on every page), the
docs' zoo table agrees with the committed zoo table, and the glossary of metrics
columns lists exactly the columns a training run writes."""

from __future__ import annotations

import os
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
# Pages another branch writes, linked before they land: a link to one passes while the file is
# absent, and is checked like any other (anchors included) once it exists.
NOT_YET_MERGED = {ROOT / "docs" / "rehearsal.md"}
README_MAX_LINES = 200


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
        return None if dest in {p.resolve() for p in NOT_YET_MERGED} else "no such file"
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
def test_glossary_lists_exactly_the_columns_a_run_writes(tiny_model_dir, fork_server, tmp_path):
    """One real smoke cell (stale sampler, dlc, 4 steps: probes, evals, a resync check) and its
    metrics.parquet columns against the glossary, both ways."""
    import pandas as pd

    out = tmp_path / "cell"
    cmd = [sys.executable, "-m", "dlcrepro", "train", "--config", str(SMOKE), "--model-dir", str(tiny_model_dir),
           "--sampler", "stale", "--correction", "dlc", "--seed", "0", "--out", str(out), "--set", "train.steps=4"]
    env = {**os.environ, "DLCREPRO_SERVER": fork_server}  # a child of the test run's fork server: no imports of its own
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    written = set(pd.read_parquet(out / "metrics.parquet").columns)
    documented = glossary_columns()
    assert documented == written, (
        f"docs/glossary.md lists columns no run writes: {sorted(documented - written)}; "
        f"a run writes columns the glossary lacks: {sorted(written - documented)}"
    )



# ----------------------------------------------------------------------------- the front door
README = ROOT / "README.md"
FINDINGS_CSV = ROOT / "paper_tables" / "findings.csv"
ZOO_CSV = ROOT / "paper_tables" / "zoo" / "zoo.csv"
RESULTS = ROOT / "docs" / "results.md"


def test_readme_is_a_front_door_of_at_most_200_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail to a page of docs/ (at most {README_MAX_LINES})"


def test_a_clone_holds_no_link_out_of_itself():
    """A tracked symbolic link must point inside the clone: a committed `.venv -> /work/main/.venv`
    (a developer's link to a shared environment) once replaced the environment of every checkout that
    pulled it, its own included, and pointed nowhere on any other machine."""
    staged = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    links = [line.split("\t", 1)[1] for line in staged.splitlines() if line.startswith("120000 ")]
    for link in links:
        target = os.readlink(ROOT / link) if (ROOT / link).is_symlink() else ""
        assert target and not os.path.isabs(target), f"{link} -> {target!r}: a tracked link must be relative"
        assert (ROOT / link).parent.joinpath(target).resolve().is_relative_to(ROOT), f"{link} -> {target} leaves the clone"


def test_ci_runs_the_readmes_test_command():
    """CI (`.ci/run`, on a clean clone) runs exactly the README's command that sets up and passes the
    tests: a changed command (`-n 3`, an install step) that CI did not run would be untested."""
    blocks = re.findall(r"```\n(.*?)\n```", README.read_text(encoding="utf-8"), re.S)
    test_command = next(b for b in blocks if "pytest" in b and "\n" not in b)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == [test_command], (ci, test_command)


def test_every_docs_page_is_linked_from_the_readme_and_says_what_it_answers():
    linked = {(README.parent / unquote(t.partition("#")[0])).resolve() for t in links(README)}
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert page.resolve() in linked, f"README.md does not link {page.relative_to(ROOT)}"
        paragraphs = [p for p in "\n".join(prose_lines(page.read_text(encoding="utf-8"))).split("\n\n") if p.strip()]
        assert paragraphs[0].startswith("# "), f"{page.relative_to(ROOT)} does not start with a title"
        assert re.match(r"(This page answers|What this page answers):", paragraphs[1]), (
            f"{page.relative_to(ROOT)}: the paragraph under the title should start 'This page answers:'"
        )
    for page in NOT_YET_MERGED:
        assert page.resolve() in linked, f"README.md should link {page.relative_to(ROOT)}"


def value(number: str) -> float:
    return float(number.replace("−", "-"))


def decimals(number: str) -> int:
    """Digits after the point of a written number (6.51e-04: 6)."""
    mantissa, _, exponent = number.partition("e")
    return (len(mantissa.split(".")[1]) if "." in mantissa else 0) - int(exponent or 0)


def rounds_to(quoted: str, source: str, scale: float = 1.0) -> bool:
    """Whether `quoted` can be the number that `source` (× scale) rounds, rounded to the quoted
    digits. Both are roundings of one value, so they lie less than half a unit of the last digit of
    each apart: 31 from 30.5, 0.65 from 0.646, but not 3.9 from 3.8."""
    tolerance = 0.5 * 10 ** -decimals(quoted) + 0.5 * 10 ** -decimals(source) * scale
    return abs(value(quoted) - value(source) * scale) < tolerance - 1e-9


def test_rounds_to_reads_two_roundings_of_one_value():
    assert rounds_to("29", "0.291", 100) and not rounds_to("31", "0.291", 100)
    assert rounds_to("31", "30.5") and rounds_to("0.65", "0.646") and rounds_to("2.30", "2.3")
    assert not rounds_to("3.9", "3.8") and not rounds_to("0.85", "0.844")


def table_rows(path: Path, header_start: str) -> list[list[str]]:
    """The body rows of the first Markdown table in `path` whose header row starts with
    `header_start`, as lists of cell texts (escaped pipes kept inside their cell)."""
    lines = prose_lines(path.read_text(encoding="utf-8"))
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def test_every_generated_findings_block_is_what_findings_csv_gives():
    """The README's and docs/results.md's findings count and table are written from
    paper_tables/findings.csv (`python -m dlcrepro docs`): each block as the table gives it now."""
    import pandas as pd

    from dlcrepro.report import findings_docs as D

    committed = pd.read_csv(FINDINGS_CSV)
    stale = []
    for page, method_link in D.pages(ROOT).items():
        text = page.read_text(encoding="utf-8")
        names = [m.group(2) for m in D.BLOCK.finditer(text)]
        assert "findings-count" in names, f"{page.relative_to(ROOT)} should say the count in a generated block"
        if D.rewrite(text, D.blocks(committed, method_link)) != text:
            stale.append(str(page.relative_to(ROOT)))
    assert not stale, f"generated blocks out of date in {stale}: run .venv/bin/python -m dlcrepro docs"
    assert "findings-table" in [m.group(2) for m in D.BLOCK.finditer(README.read_text(encoding="utf-8"))]


VERDICT_COUNT = re.compile(r"\b\d+ (?:seen|not seen|not replicated|contradicted|undecided)\b")


def test_no_page_counts_verdicts_outside_a_generated_block():
    """One count: a verdict count typed by hand (README, docs/) would drift from findings.csv. The
    lab notebook, docs/measurements.md, keeps dated counts of earlier studies and is left out."""
    from dlcrepro.report import findings_docs as D

    typed = []
    for page in DOCS:
        if page.name == "measurements.md":
            continue
        text = D.BLOCK.sub("", page.read_text(encoding="utf-8"))
        typed += [f"{page.relative_to(ROOT)}: {m.group(0)!r}" for m in VERDICT_COUNT.finditer(" ".join(prose_lines(text)))]
    assert not typed, "verdict counts outside generated blocks:\n" + "\n".join(typed)


def test_the_count_is_the_tables_and_a_changed_verdict_changes_it():
    import pandas as pd

    from dlcrepro.report import findings_docs as D

    committed = pd.read_csv(FINDINGS_CSV)
    text = D.count_text(committed)
    m = re.fullmatch(r"(\d+) findings checked: (\d+) seen, .*", text)
    assert m and int(m.group(1)) == len(committed) and int(m.group(2)) == int((committed["verdict"] == "seen").sum())
    changed = committed.copy()
    changed.loc[changed["finding"] == "F3", "verdict"] = "contradicted"
    assert D.count_text(changed) != text
    assert f"{int((committed['verdict'] == 'contradicted').sum()) + 1} contradicted" in D.count_text(changed)
    page = "x <!-- begin findings-count -->" + text + "<!-- end findings-count --> y"
    assert D.rewrite(page, D.blocks(changed, "m.md")) != page
    assert D.category("not seen (seeds 3,4,5 not run)") == "not seen"
    assert D.category("seen on 2 of 3 machines") == "seen on k of n machines"


def test_results_zoo_table_agrees_with_the_committed_zoo():
    """docs/results.md's zoo table ('57 % · 1.0×, drops 55 %, 1 of 3 diverged' per correction and
    sampler) against paper_tables/zoo/zoo.csv: final accuracy, M, the share of dropped tokens and the
    runs that diverged (said where any did); '(= `is`)' is a copied cell whose numbers equal its twin's."""
    import pandas as pd

    zoo = pd.read_csv(ZOO_CSV).set_index(["sampler", "correction"])
    # the final accuracy's column, named by its measure ("RL-pool accuracy (sampled), final (mean [95 % CI])";
    # "final (mean [95 % CI])" in a table written before accuracies were named)
    final_column = next(c for c in zoo.columns if c.endswith("final (mean [95 % CI])"))
    rows = table_rows(RESULTS, "| correction | `bf16` | `fp8` | `stale` | `fp8_stale` |")
    samplers = ["bf16", "fp8", "stale", "fp8_stale"]
    named = {name for row in rows for name in re.findall(r"`(\w+)`", row[0])}  # '`pg` (= `ppo`)' names both
    assert named == set(zoo.index.get_level_values("correction")), \
        "docs/results.md's zoo table should name every correction of the zoo"
    problems = []
    for name, *cells in rows:
        correction = re.match(r"`(\w+)`", name).group(1)
        for sampler, cell in zip(samplers, cells):
            row = zoo.loc[(sampler, correction)]
            twin = re.fullmatch(r"\(= `(\w+)`\)", cell)
            if twin:
                other = zoo.loc[(sampler, twin.group(1))]  # the same runs; intervals differ (each cell its own stream)
                same = (final_column, "mean")
                if [str(row[c]).split(" ")[0] for c in same] != [str(other[c]).split(" ")[0] for c in same]:
                    problems.append(f"{sampler}/{correction}: not the numbers of {twin.group(1)}")
                continue
            m = re.fullmatch(r"(?:\*\*)?(\d+) % · ([\d.,]+)×(?:\*\*)?(?:, drops (\d+) %)?(?:, † (\d) of \d diverged \(steps? "
                             r"([\d, ]+)\))?", cell)
            if not m:
                problems.append(f"{sampler}/{correction}: cannot read {cell!r}")
                continue
            accuracy, multiple, dropped, diverged, at = m.groups()
            multiple = multiple.replace(",", "")
            if int(diverged or 0) != str(row["diverged"]).count("seed"):
                problems.append(f"{sampler}/{correction}: {diverged or 0} diverged, the table {row['diverged']!r}")
            if at and [int(x) for x in at.split(",")] != [int(x) for x in re.findall(r"at step (\d+)", str(row["diverged"]))]:
                problems.append(f"{sampler}/{correction}: diverged at steps {at}, the table {row['diverged']!r}")
            final = row[final_column].split(" ")[0]
            if not rounds_to(accuracy, final, 100):
                problems.append(f"{sampler}/{correction}: accuracy {accuracy} %, the table {final}")
            if not rounds_to(multiple, repr(float(row["mean"]))):
                problems.append(f"{sampler}/{correction}: M {multiple}, the table {row['mean']:.4g}")
            if dropped is not None and not rounds_to(dropped, repr(float(row["dropped tokens"])), 100):
                problems.append(f"{sampler}/{correction}: drops {dropped} %, the table {row['dropped tokens']}")
    assert not problems, "docs/results.md's zoo table and paper_tables/zoo/zoo.csv disagree:\n" + "\n".join(problems)


def test_readme_gpu_hours_are_the_plans():
    """The README quotes what `python -m dlcrepro plan --config configs/paper.yaml` prints: minutes
    per trained job of each model, the trained cells and copies, GPU-hours estimated and requested."""
    from dlcrepro import cluster
    from dlcrepro.core.config import load

    cfg = load(ROOT / "configs" / "paper.yaml")
    plan = cluster.plan_text(cfg, "configs/paper.yaml")
    per_job = {m: f"{cluster.estimated_minutes(cfg, m):.1f}" for m in ("qwen3-0.6b", "qwen3-1.7b")}
    ppo = {m: f"{cluster.estimated_minutes(cfg, m, 'ppo_multi'):.1f}" for m in ("qwen3-0.6b", "qwen3-1.7b")}
    total = re.search(r"^total\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+\.\d)\s+(\d+\.\d)$", plan, re.M)
    shared = re.search(r"^shared rollouts: (\d+) job", plan, re.M)
    initial = re.search(r"^θ_0 evaluations: (\d+) job", plan, re.M)
    assert total and shared and initial, plan
    cells, trained, copied, requested, estimated = total.groups()
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert (f"{per_job['qwen3-0.6b']} minutes per Qwen3-0.6B job and {per_job['qwen3-1.7b']} per Qwen3-1.7B job "
            f"({ppo['qwen3-0.6b']} and {ppo['qwen3-1.7b']} for a `ppo_multi` job") in text
    assert (f"{estimated} GPU-hours for the {trained} trained cells, {shared.group(1)} rollouts jobs and {initial.group(1)} θ_0 "
            f"evaluations ({float(requested):g} requested") in text
    assert (f"{cells} cells, {trained} GPU jobs + {shared.group(1)} rollouts jobs + {initial.group(1)} θ_0 evaluations + "
            f"{copied} copies without a GPU") in text
