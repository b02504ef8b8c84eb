"""The pages' findings, written from paper_tables/findings.csv: one count and one table everywhere.

The README and docs/results.md hold generated blocks between `<!-- begin NAME ... -->` and
`<!-- end NAME -->`; `python -m dlcrepro docs` rewrites them from the committed findings table (after
the study's tables are written), and tests/test_docs.py fails where a block differs from what the
table gives. So a count of verdicts is never typed by hand: a page says what findings.csv says.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pandas as pd

from ..core.util import atomic_write_text

# verdict categories in the order a count lists them (findings.findings_table's `verdict`); the others
# are the words of tables written before the pooled verdict (two groups of seeds judged apart, a finding
# relabelled across machines) and before three verdicts (findings.csv without "seeds to decide")
CATEGORIES = ("seen", "seen on one machine", "seen on k of n machines", "seen in 1 replicate", "contradicted",
              "contradicted in 1 replicate", "not replicated", "undecided", "cannot tell", "holds in 1 replicate", "not seen")
ALWAYS = ("seen", "contradicted", "undecided")  # counted even where 0
ALWAYS_BEFORE = ("seen", "not replicated", "not seen")  # in a table written before three verdicts
DECIDE = "seeds to decide"  # findings.findings_table's column: the seeds an undecided finding would need
BLOCK = re.compile(r"(<!-- begin ([\w-]+)[^>]*-->)(.*?)(<!-- end \2 -->)", re.S)


def category(verdict: str) -> str:
    """A verdict's category: "not seen (seeds 3,4,5 not run)" -> "not seen"."""
    v = str(verdict).split(" (")[0]
    return "seen on k of n machines" if re.fullmatch(r"seen on \d+ of \d+ machines", v) else v


def verdict_of(findings: pd.DataFrame) -> pd.Series:
    """The verdicts of a findings table, of the current form or an older one (findings.verdict_of)."""
    from .findings import verdict_of as verdicts

    return verdicts(findings)


def replicate_columns(findings: pd.DataFrame) -> list[str]:
    """The replicate columns of a findings table ("seeds 0,1,2"), its numeric columns left out."""
    from .findings import replicate_columns as columns

    return columns(findings)


def count_text(findings: pd.DataFrame) -> str:
    """"15 findings checked: 5 seen, 2 contradicted, 8 undecided" (other categories where present;
    a table from before three verdicts: "8 seen, 0 not replicated, 7 not seen")."""
    n = Counter(category(v) for v in verdict_of(findings))
    always = ALWAYS if DECIDE in findings else ALWAYS_BEFORE
    parts = [f"{n.get(c, 0)} {c}" for c in CATEGORIES if c in always or n.get(c)]
    return f"{len(findings)} findings checked: " + ", ".join(parts)


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def rules_text(findings: pd.DataFrame) -> str:
    """Which rules and which machine the verdicts come from."""
    rules = sorted(set(findings["rules"].astype(str))) if "rules" in findings else []
    machine = sorted(set(findings["machine"].astype(str))) if "machine" in findings else []
    others = sorted(set(findings["other machines"].astype(str))) if "other machines" in findings else []
    r = ("rules of commit " + ", ".join(f"`{x}`" for x in rules)) if rules else \
        "rules from before the rules for the rerun (the table records no commit: written before `findings.RULES_COMMIT`)"
    m = f"computed on {', '.join(machine)}" if machine else "CPU kind not recorded"
    o = "; other CPU kinds: " + ("none compared" if others in ([], ["none compared"])
                                 else "see the table's `other machines` column")
    return f"Verdicts by the {r} ([method.md](METHOD#findings-and-replicates)), {m}{o}."


def table_text(findings: pd.DataFrame, with_rule: bool = False) -> str:
    """The findings table in Markdown: the finding, the paper's value, what every seed shows (`result`,
    with its mark: ✓ seen, ✗ contradicted, ? undecided), the seeds it pools, the verdict (bold where
    seen), the seeds an undecided finding would need, and each group of seeds' mark and number beside
    (a display of stability); a table from before the pooled verdict: each replicate's column instead."""
    reps = replicate_columns(findings)
    decide = [DECIDE] if DECIDE in findings else []
    pooled = ["result", "seeds"] if "result" in findings else []
    head = ["", "paper", *(["rule"] if with_rule else []), *pooled, "verdict", *decide, *reps]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    verdicts = verdict_of(findings)
    for (_, r), v in zip(findings.iterrows(), verdicts):
        label = f"{r['finding']}: {r['what']}" + (f" ({r['model']})" if findings["model"].nunique() > 1 else "")
        verdict = f"**{v}**" if category(v) == "seen" else str(v)
        cells = [label, r["paper"], *([r["rule"]] if with_rule else []), *(r[c] for c in pooled), verdict,
                 *(r[c] for c in decide), *(r[c] for c in reps)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def by_verdict_text(findings: pd.DataFrame) -> str:
    """"Seen: R, M, F4. Not seen: F2, F3." in the order of CATEGORIES."""
    groups: dict[str, list[str]] = {}
    for (_, r), v in zip(findings.iterrows(), verdict_of(findings)):
        groups.setdefault(category(v), []).append(str(r["finding"]))
    return " ".join(f"{c[0].upper() + c[1:]}: {', '.join(groups[c])}." for c in CATEGORIES if c in groups)


def blocks(findings: pd.DataFrame, method_link: str) -> dict[str, str]:
    """Every generated block's text by name (what goes between its begin and end markers)."""
    rules = rules_text(findings).replace("METHOD", method_link)
    return {
        "findings-count": count_text(findings),
        "findings-table": f"\n{rules}\n\n{table_text(findings)}\n\n{by_verdict_text(findings)}\n",
        "findings-table-full": f"\n{rules}\n\n{table_text(findings, with_rule=True)}\n",
    }


def rewrite(text: str, generated: dict[str, str]) -> str:
    """`text` with each generated block's content replaced; a block of unknown name is an error."""
    def one(m: re.Match) -> str:
        name = m.group(2)
        if name not in generated:
            raise KeyError(f"a generated block named {name!r}; known: {sorted(generated)}")
        return m.group(1) + generated[name] + m.group(4)

    return BLOCK.sub(one, text)


def pages(root: Path) -> dict[Path, str]:
    """The pages with generated blocks and the link from each to docs/method.md."""
    return {root / "README.md": "docs/method.md", root / "docs" / "results.md": "method.md"}


def update(root: Path, findings_csv: Path) -> list[Path]:
    """Rewrite every page's generated blocks from `findings_csv`; the pages that changed."""
    # a commit like 4e67747 is no number
    findings = pd.read_csv(findings_csv, dtype={"rules": str, "machine": str, "verdict": str})
    changed = []
    for page, method_link in pages(root).items():
        text = page.read_text(encoding="utf-8")
        new = rewrite(text, blocks(findings, method_link))
        if new != text:
            atomic_write_text(page, new)
            changed.append(page)
    return changed
