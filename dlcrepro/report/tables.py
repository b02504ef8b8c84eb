"""The paper tables: each a DataFrame, written as .tex (booktabs), .md and .csv, the paper's number
beside ours wherever PAPER.md reports one for that cell."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from . import analysis as A
from . import outputs
from . import paper as P
from .findings import across_machines, findings_from_input, findings_input, replicates_not_run
from ..core.grid import lagged_samplers
from . import formats as F
from .formats import interval_text, number
from ..core.util import DamagedFileError, atomic_write_text

# The paper's numbers beside ours, as text, from paper.py (their one home) through formats.py. The paper does not say
# which model F3–F7 and F10 refer to, so they stand beside every model's cell; F8's 1.9x is Qwen3-0.6B's.
PAPER_ESS = (f"{P.F2_MODEL}: ESS {P.F2_ESS_CROSSING}, Gaussian {P.F2_GAUSSIAN_CROSSING}, "
             f"IS leaves floor {P.F2_IS_LEAVES_FLOOR} (F2)")  # beside F2's sampler's rows
PAPER_RESYNC = f"{P.F9_MODEL}: {', '.join(map(str, P.F9_RESYNC_STEPS))} (F9)"  # beside F9's cell's runs
PAPER_OFF_SUPPORT = {r: F.paper_off_support(r) for r in ("without", "with")}
PAPER_SPEARMAN = {m: f"{rho:.2f} (F13)" for m, rho in P.F13_RHO.items()}


DIVERGED_MARK = "†"  # beside a number that stops at a run's divergence (docs/method.md#diverged-runs)


def _marked(text: str, diverged: str) -> str:
    """`text` with the divergence mark where any of the cell's runs diverged ("none" where none did)."""
    return text if diverged in ("none", "") or text == "n/a" else f"{text} {DIVERGED_MARK}"


M_MARGINS = (1.0, A.LEAVE_FLOOR_RATIO)  # the floor and "left the floor": an M interval's ends print on their side of both


def noise_floor_table(steps: pd.DataFrame, pr: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the mean over runs of M with its 95 % t-interval over runs (analysis.multiple_interval),
    the runs with a multiple among all the cell's runs, the probe steps that entered; a cell with a
    diverged run is marked † (its M stops at the divergence) and names the runs and steps."""
    s = A.multiple_interval(steps, pr)
    s = s.merge(diverged_runs(pr), on=A.CELL, how="left").fillna({"diverged": "none"})
    s["M (mean [95 % CI])"] = [_marked(interval_text(m, lo, hi, M_MARGINS), d)
                               for m, lo, hi, d in zip(s["mean"], s["ci_low"], s["ci_high"], s["diverged"])]
    s["runs with a multiple"] = [f"{v}/{n}" for v, n in zip(s["n_valid"], s["n_runs"])]
    s["paper"] = [F.paper_multiple((a, b)) for a, b in zip(s["sampler"], s["correction"])]
    shown = ["M (mean [95 % CI])", "runs with a multiple", "probe_steps", "probed_steps", "diverged", "paper"]
    return s[A.CELL + shown + ["mean", "ci_low", "ci_high"]]


def accuracy_table(pr: pd.DataFrame, name: str = "test accuracy", heldout: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per cell: θ_0's and the final accuracy `name` measures (mean [95 % t-interval] over runs), the rise
    between them, each seed's final (a diverged run: 0, with its step), and beside them the held-out
    accuracy (greedy) at θ_0 and at the end where it was measured beside a pool accuracy
    (`heldout`: analysis.final_heldout)."""
    pr = pr.assign(rise=pr["final_test_accuracy"] - pr["initial_test_accuracy"])
    fin, start, rise = (A.mean_interval(pr, c) for c in ("final_test_accuracy", "initial_test_accuracy", "rise"))
    s = fin.merge(start, on=A.CELL, suffixes=("", "_start")).merge(rise, on=A.CELL, suffixes=("", "_rise"))
    s[f"{name} at step 0"] = [number(m) for m in s["mean_start"]]
    s[f"{name}, final (mean [95 % CI])"] = [interval_text(m, lo, hi) for m, lo, hi in zip(s["mean"], s["ci_low"], s["ci_high"])]
    s["rise (mean [95 % CI])"] = [interval_text(m, lo, hi)
                                  for m, lo, hi in zip(s["mean_rise"], s["ci_low_rise"], s["ci_high_rise"])]
    pr = pr.assign(_final=[number(a) + (f" ({DIVERGED_MARK} diverged at step {int(d)})" if d == d else "")
                           for a, d in zip(pr["final_test_accuracy"], pr["diverged_at_step"])])
    per_seed = pr.sort_values("seed").groupby(A.CELL)["_final"].apply("/".join).rename("final per seed")
    s = s.merge(per_seed.reset_index(), on=A.CELL, how="left")
    shown = [f"{name} at step 0", f"{name}, final (mean [95 % CI])", "rise (mean [95 % CI])", "final per seed"]
    if heldout is not None and heldout["final_heldout"].notna().any():
        h0, h1 = (A.mean_interval(heldout.rename(columns={c: "x"}), "x") for c in ("initial_heldout", "final_heldout"))
        s[f"{A.HELDOUT_GREEDY} at step 0"] = s[A.CELL].merge(h0, on=A.CELL, how="left")["mean"].map(number).to_numpy()
        h1 = s[A.CELL].merge(h1, on=A.CELL, how="left")
        s[f"{A.HELDOUT_GREEDY}, final (mean [95 % CI])"] = [interval_text(m, lo, hi)
                                                             for m, lo, hi in zip(h1["mean"], h1["ci_low"], h1["ci_high"])]
        shown += [f"{A.HELDOUT_GREEDY} at step 0", f"{A.HELDOUT_GREEDY}, final (mean [95 % CI])"]
    s["paper"] = [F.paper_accuracy((a, b)) for a, b in zip(s["sampler"], s["correction"])]
    return s[A.CELL + shown + ["paper", "mean", "ci_low", "ci_high"]]


def ess_crossing_table(pr: pd.DataFrame, correction: str = "is") -> pd.DataFrame:
    """Per model x lagged sampler: empirical vs Gaussian crossing and the step `is` leaves the floor, per seed."""
    d = pr.loc[pr["sampler"].isin(lagged_samplers()) & (pr["correction"] == correction)]
    rows = []
    for (model, sampler), g in d.groupby(["model", "sampler"]):
        g = g.sort_values("seed")
        lst = lambda c: ", ".join(number(v) for v in g[c])  # noqa: E731
        rows.append({
            "model": model, "sampler": sampler, "correction": correction,
            "ESS < 1/2 at step (per seed)": lst("ess_crossing_step"),
            "Gaussian predicts (per seed)": lst("ess_gauss_crossing_step"),
            f"{correction} leaves the floor (per seed)": lst("leave_floor_step"),
            "diverged (per seed)": ", ".join(f"{DIVERGED_MARK} at step {int(v)}" if v == v else "no"
                                             for v in g["diverged_at_step"]),
            "paper": PAPER_ESS if sampler == P.F2_SAMPLER else "",
        })
    return pd.DataFrame(rows)


def resync_table(pr: pd.DataFrame) -> pd.DataFrame:
    d = pr.loc[pr["correction"].isin(A.RESYNC_CORRECTIONS)].sort_values(A.RUN)
    out = d[A.RUN].copy()
    out["resync steps"] = [", ".join(map(str, json.loads(s))) or "none" for s in d["resync_steps"]]
    out["diverged"] = [f"{DIVERGED_MARK} at step {int(v)}" if v == v else "no" for v in d["diverged_at_step"]]
    out["paper"] = [PAPER_RESYNC if (s, c) == P.F9_CELL else "" for s, c in zip(d["sampler"], d["correction"])]
    return out


# the off-support summary's columns as a reader reads them, with their units
OFF_SUPPORT_HEADERS = {"collapse_points": "collapse points", "off_support_before_max": "off-support share before collapse (max)",
                       "off_support_at_collapse_mean": "off-support share at collapse (mean)",
                       "kl_sampler_at_collapse_mean": "kl_sampler at collapse (mean, nats/token)",
                       "kl_sampler_healthy_min": "kl_sampler of healthy runs (min, nats/token)",
                       "kl_sampler_healthy_max": "kl_sampler of healthy runs (max, nats/token)"}


def off_support_table(drops: pd.DataFrame) -> pd.DataFrame:
    t = A.off_support_summary(drops)
    t["paper"] = [PAPER_OFF_SUPPORT[r] for r in t["resync"]]
    return t.rename(columns=OFF_SUPPORT_HEADERS)


def zoo_table(steps: pd.DataFrame, pr: pd.DataFrame, name: str = "test accuracy") -> pd.DataFrame:
    """Per model × sampler, the grid's corrections ranked by M (lowest first: closest to on-policy
    training), beside their final accuracy (`name`) and its rank (highest first), and what each
    correction did to its tokens: the mean over steps of its truncated and dropped token shares, and
    its largest token weight over the runs (`corr_*` metrics columns; n/a for runs written before
    them). The rank by M is over the cells whose runs all finished with every probe step in M; a
    cell with a diverged run, or with probe steps left out of M (a run that collapsed: floor 0 from
    then on), has no rank ("—") and is listed after them, its probe steps in M beside the probed ones
    (`probe steps in M`): ranking a truncated M beside full runs would compare different measures.
    Equal means share a rank (a copied cell and its source). The rank by accuracy is over the cells
    whose runs all finished."""
    m = noise_floor_table(steps, pr)
    acc = accuracy_table(pr, name)
    final = f"{name}, final (mean [95 % CI])"
    t = m[A.CELL + ["M (mean [95 % CI])", "mean", "ci_low", "ci_high", "probe_steps", "probed_steps"]].merge(
        acc[A.CELL + [final, "mean"]].rename(columns={"mean": "accuracy_mean"}), on=A.CELL, how="outer")
    diag = {"corr_clipped_share": "mean", "corr_masked_share": "mean", "corr_weight_max": "max"}
    have = [c for c in diag if c in steps.columns]
    d = steps.groupby(A.CELL)[have].agg({c: diag[c] for c in have}).reset_index() if have else steps[A.CELL].drop_duplicates()
    t = t.merge(d, on=A.CELL, how="left").merge(diverged_runs(pr), on=A.CELL, how="left").fillna({"diverged": "none"})
    t["M (mean [95 % CI])"] = t["M (mean [95 % CI])"].fillna("n/a")  # a cell without a metrics row: every run diverged at step 1
    rows = []
    for _, g in t.groupby(["model", "sampler"], sort=True):
        finished = g["diverged"] == "none"
        whole = finished & (g["probe_steps"] == g["probed_steps"]) & g["mean"].notna()
        g = g.assign(_unranked=~whole).sort_values(["_unranked", "mean", "correction"], na_position="last").copy()
        g["rank by M"] = g["mean"].where(whole).rank(method="min").astype("Int64")
        g["rank by accuracy"] = g["accuracy_mean"].where(finished).rank(ascending=False, method="min").astype("Int64")
        rows.append(g.drop(columns="_unranked"))
    t = pd.concat(rows, ignore_index=True)
    t["truncated tokens"] = [number(v) for v in t.get("corr_clipped_share", pd.Series(math.nan, index=t.index))]
    t["dropped tokens"] = [number(v) for v in t.get("corr_masked_share", pd.Series(math.nan, index=t.index))]
    t["largest weight"] = [number(v) for v in t.get("corr_weight_max", pd.Series(math.nan, index=t.index))]
    for col in ("rank by M", "rank by accuracy"):
        t[col] = [str(int(v)) if not pd.isna(v) else "—" for v in t[col]]
    t["probe steps in M"] = [f"{int(a)} of {int(b)}" if b == b else "n/a" for a, b in zip(t["probe_steps"], t["probed_steps"])]
    return t[["model", "sampler", "rank by M", "correction", "M (mean [95 % CI])", "probe steps in M", final, "rank by accuracy",
              "truncated tokens", "dropped tokens", "largest weight", "diverged", "mean", "ci_low", "ci_high"]]


def diverged_runs(pr: pd.DataFrame) -> pd.DataFrame:
    """Per cell, its runs that diverged ("† 2 of 3: seed 1 at step 9, seed 2 at step 7"; "none"): their
    final accuracy counts as 0 and their M is over their probe steps before the divergence."""
    def one(g):
        at = [f"seed {s} at step {int(a)}" for s, a in zip(g["seed"], g["diverged_at_step"]) if a == a]
        return f"{DIVERGED_MARK} {len(at)} of {len(g)}: {', '.join(at)}" if at else "none"

    text = pr.sort_values("seed").groupby(A.CELL).apply(one, include_groups=False)
    return text.rename("diverged").reset_index()


def spearman_out(steps: pd.DataFrame, drops: pd.DataFrame, n_boot: int = 1000) -> pd.DataFrame:
    t = A.spearman_table(steps, drops, n_boot=n_boot)
    t["rho [95 % CI]"] = [f"{number(r)} [{number(lo)}, {number(hi)}]" for r, lo, hi in zip(t["rho"], t["ci_low"], t["ci_high"])]
    t["paper"] = [PAPER_SPEARMAN[m] for m in t["measure"]]
    return t


# ----------------------------------------------------------------------------- writers


# Characters a table holds, as pdflatex writes them in text mode with no package beyond booktabs and
# array (tests/test_tables_tex.py compiles every table). Anything else outside ASCII is an error.
TEX_TEXT = {"/": r"/\allowbreak{}", "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_\allowbreak{}", "#": r"\#",
            "$": r"\$", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "<": r"\textless{}",
            ">": r"\textgreater{}", "|": r"\textbar{}"}
TEX_SYMBOL = {"±": r"\pm", "≤": r"\le", "≥": r"\ge", "→": r"\to", "×": r"\times", "−": "-", "δ": r"\delta", "λ": r"\lambda",
              "θ": r"\theta", "ρ": r"\rho", "π": r"\pi", "ε": r"\varepsilon", "Σ": r"\Sigma", "·": r"\cdot", "‖": r"\|",
              "✓": r"\surd", "✗": r"\times", "≈": r"\approx", "√": r"\sqrt{}", "∞": r"\infty", "†": r"\dagger", "∇": r"\nabla",
              "β": r"\beta",
              "α": r"\alpha", "μ": r"\mu", "σ": r"\sigma", "⁻": "^-", "¹": "^1", "²": "^2", "³": "^3", "₀": "_0"}
TEX_WORD = {"–": "--", "—": "---", "’": "'", "“": "``", "”": "''", "…": r"\ldots{}", " ": " "}


def _tex_escape(s: str) -> str:
    r"""`s` as LaTeX text: specials escaped, Greek letters and symbols in math mode ($\lambda$, $\times$;
    neighbouring symbols share one math span)."""
    out, math = [], []
    for ch in str(s):
        if ch in TEX_SYMBOL:
            math.append(TEX_SYMBOL[ch] + (" " if TEX_SYMBOL[ch][-1].isalpha() else ""))
            continue
        if math:
            out.append("$" + "".join(math).rstrip() + "$")
            math = []
        if ch in TEX_TEXT:
            out.append(TEX_TEXT[ch])
        elif ch in TEX_WORD:
            out.append(TEX_WORD[ch])
        elif ord(ch) < 128:
            out.append(ch)
        else:
            raise ValueError(f"tables: no LaTeX for {ch!r} (U+{ord(ch):04X}) in {s!r}: add it to tables.TEX_SYMBOL")
    if math:
        out.append("$" + "".join(math).rstrip() + "$")
    return "".join(out)


# type sizes from the largest down: (LaTeX, the share of the text width a character takes, the
# share one column's separation takes). The last, 1 pt between columns, is for the zoo table's 11
# columns once its accuracy header names the measure: at 2 pt its words stuck out by 5.5 pt.
TEX_SIZES = ((r"\small", 0.015, 0.035), (r"\footnotesize\setlength{\tabcolsep}{3pt}", 0.0135, 0.018),
             (r"\scriptsize\setlength{\tabcolsep}{2pt}", 0.0115, 0.012),
             (r"\scriptsize\setlength{\tabcolsep}{1pt}", 0.0115, 0.006))
# a line of each size in pt (article at 10 pt: \small 11, \footnotesize 9.5, \scriptsize 8)
TEX_LEADING = {r"\small": 11.0, r"\footnotesize": 9.5, r"\scriptsize": 8.0}
# A table estimated taller than this (in pt; article's text height at 10 pt is ~550 pt) is a longtable,
# which breaks across pages: a float taller than a page is only a warning ("Float too large") and runs
# off the page. Half a page, as the estimate counts characters, not the lines TeX breaks.
TEX_FLOAT_MAX_PT = 275.0


def _tex_cells(df: pd.DataFrame) -> dict[str, list[str]]:
    return {c: [str(c)] + [number(v) for v in df[c]] for c in df.columns}


def _longest_word(texts: list[str]) -> int:
    """The longest run of characters a line cannot break in (LaTeX breaks at spaces, / and _ here)."""
    return max(max(len(w) for w in re.split(r"[\s/_]+", t)) for t in texts)


def tex_font(df: pd.DataFrame) -> tuple[str, float, float]:
    """The largest type size at which every column's longest word fits the text width."""
    words = [max(_longest_word(t), 2) for t in _tex_cells(df).values()]
    for size, per_char, sep in TEX_SIZES:
        if per_char * sum(words) + sep * len(words) <= 1.0:
            return size, per_char, sep * len(words)
    size, per_char, sep = TEX_SIZES[-1]
    return size, per_char, sep * len(words)


def tex_column_widths(df: pd.DataFrame) -> list[float]:
    """Each column's share of the text width: at least its longest word, the rest of the width in
    proportion to its longest cell (at most 60 characters counted)."""
    cells = _tex_cells(df)
    _, per_char, separations = tex_font(df)
    free = 1.0 - separations
    base = {c: per_char * max(_longest_word(t), 2) for c, t in cells.items()}
    longest = {c: min(60, max(len(x) for x in t)) for c, t in cells.items()}
    rest = max(0.0, free - sum(base.values()))
    extra = {c: max(0.0, per_char * longest[c] - base[c]) for c in df.columns}
    total = sum(extra.values()) or 1.0
    widths = {c: base[c] + (rest * extra[c] / total if sum(extra.values()) > rest else extra[c]) for c in df.columns}
    squeeze = min(1.0, free / sum(widths.values()))  # words too long even in the smallest size: a word may stick out
    return [w * squeeze for w in widths.values()]


def tex_column_spec(df: pd.DataFrame) -> str:
    """Ragged-right paragraph columns that share the text width (`tex_column_widths`)."""
    return "".join(r">{\raggedright\arraybackslash}p{" + f"{w:.3f}" + r"\linewidth}" for w in tex_column_widths(df))


def tex_height(df: pd.DataFrame, caption: str = "") -> float:
    """The table's estimated height in pt at its type size (`tex_font`): the caption's lines, then per
    row (the header first) its tallest cell's lines, its characters over its column's
    (`tex_column_widths`), and the rules' space."""
    size, per_char, _ = tex_font(df)
    leading = TEX_LEADING[size.split("\\setlength")[0]]
    widths, cells = tex_column_widths(df), _tex_cells(df)

    def lines(texts: list[str], shares: list[float]) -> int:
        return max(math.ceil(len(t) * per_char / max(w, per_char)) for t, w in zip(texts, shares))

    rows = [[cells[c][i] for c in df.columns] for i in range(len(df) + 1)]
    return leading * (lines([caption], [1.0]) + sum(lines(r, widths) for r in rows) + 4)


def to_tex(df: pd.DataFrame, caption: str) -> str:
    r"""A booktabs table that fits the text width (`tex_column_spec`) and a page's height: a float
    where its estimated height (`tex_height`) is at most TEX_FLOAT_MAX_PT, else a longtable whose
    header repeats on each page. It needs \usepackage{booktabs,array,longtable} and compiles with pdflatex."""
    cols = list(df.columns)
    size, spec = tex_font(df)[0], tex_column_spec(df)
    header = [r"\toprule", " & ".join(_tex_escape(str(c)) for c in cols) + r" \\", r"\midrule"]
    body = [" & ".join(_tex_escape(number(v)) for v in r) + r" \\" for _, r in df.iterrows()]
    if tex_height(df, caption) <= TEX_FLOAT_MAX_PT:
        lines = [r"% needs \usepackage{booktabs,array}", r"\begin{table}[t]", r"\centering", size,
                 rf"\caption{{{_tex_escape(caption)}}}", r"\begin{tabular}{" + spec + "}", *header, *body, r"\bottomrule",
                 r"\end{tabular}", r"\end{table}", ""]
    else:
        continued = rf"\multicolumn{{{len(cols)}}}{{@{{}}l}}{{\emph{{(continued)}}}} \\"
        lines = [r"% needs \usepackage{booktabs,array,longtable}: taller than half a page, it breaks across pages",
                 "{" + size, r"\begin{longtable}{" + spec + "}", rf"\caption{{{_tex_escape(caption)}}} \\", *header,
                 r"\endfirsthead", continued, *header, r"\endhead", r"\bottomrule", r"\endlastfoot", *body, r"\end{longtable}",
                 "}", ""]
    return "\n".join(lines)


def to_md(df: pd.DataFrame, caption: str) -> str:
    cols = list(df.columns)
    out = [f"{caption}", "", "| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        out.append("| " + " | ".join(number(v).replace("|", "/") for v in r) + " |")
    return "\n".join(out) + "\n"


def csv_only(df: pd.DataFrame) -> list[str]:
    """The columns a table keeps for programs (the .csv) and leaves out of the .md and .tex: raw
    numbers its text columns already show, and the findings' headline numbers (the summary figure's)."""
    numeric = ("mean", "sd", "ci_low", "ci_high", "unit", "paper value", "paper value derived")
    findings_numbers = ("value", "low", "high", "seeds needed", "decidable")  # the findings' `result` shows them
    said_in_caption = ("machine", "rules", "level")  # the findings caption names them (one value per table)
    nothing_compared = "other machines" in df.columns and (df["other machines"] == "none compared").all()
    per_replicate = (" value", " low", " high", " seeds needed")
    is_findings = "result" in df.columns
    if is_findings and df["model"].nunique() == 1:
        said_in_caption += ("model",)  # one model: the findings caption names it
    return [c for c in df.columns if c in numeric + said_in_caption or (is_findings and c in findings_numbers)
            or (c.startswith("seeds ") and c.endswith(per_replicate)) or (c == "other machines" and nothing_compared)]


def redraw_tex(directory: Path) -> list[Path]:
    """Rewrite each table's .tex in `directory` from its .csv, with the caption its .md starts with:
    the same numbers, in the current LaTeX form (for tables written before it). The .tex files written.

    A blank .csv cell is either text left empty (a `paper` column without a paper number) or a
    missing number (shown "n/a"); the .md's cell tells which. The .md alone will not do: it shows a
    "|" in a cell as "/"."""
    done = []
    for csv in sorted(Path(directory).glob("*.csv")):
        md, tex = csv.with_suffix(".md"), csv.with_suffix(".tex")
        if not md.exists() or not tex.exists():
            continue
        caption, header, shown_rows = _md_table(md.read_text(encoding="utf-8"))
        df = pd.read_csv(csv, keep_default_na=False, dtype=str)
        df = df.drop(columns=csv_only(df)).map(_as_written).rename(columns=OFF_SUPPORT_HEADERS)  # readable headers
        if header != list(df.columns) or len(shown_rows) != len(df):
            raise DamagedFileError(f"{md} shows {len(shown_rows)} rows of {header}, {csv} has {len(df)} of {list(df.columns)}: "
                                   f"not one table; write both again with `python -m dlcrepro tables`")
        df = df.mask(df == "", pd.DataFrame(shown_rows, index=df.index, columns=df.columns))
        atomic_write_text(tex, to_tex(tex_shown(df, csv.stem), caption))
        done.append(tex)
    return done


def _md_table(text: str) -> tuple[str, list[str], list[list[str]]]:
    """`to_md`'s caption, header and rows, each cell as shown."""
    lines = text.splitlines()
    caption, table = lines[0], [ln for ln in lines[2:] if ln.startswith("|")]

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip()[1:-1].split("|")]  # `to_md` writes a cell's "|" as "/"

    return caption, cells(table[0]), [cells(ln) for ln in table[2:]]


def _as_written(text: str) -> str:
    """A .csv cell as a table shows it: a float to 3 significant digits (`formats.number`), an integer or text as it is."""
    try:
        return text if text.lstrip("-").isdigit() else number(float(text))
    except ValueError:
        return text


# Columns the .tex leaves out where the page cannot hold them beside the rest (the .md and .csv keep
# them): the findings' rule in words, which docs/method.md lists finding by finding.
TEX_LEAVES_OUT = {"findings": ("rule",)}


def tex_shown(df: pd.DataFrame, name: str) -> pd.DataFrame:
    return df.drop(columns=[c for c in TEX_LEAVES_OUT.get(name, ()) if c in df])


def write_table(df: pd.DataFrame, out: Path, name: str, caption: str) -> None:
    shown = df.drop(columns=csv_only(df))
    atomic_write_text(out / f"{name}.csv", df.to_csv(index=False))
    atomic_write_text(out / f"{name}.md", to_md(shown, caption))
    atomic_write_text(out / f"{name}.tex", to_tex(tex_shown(shown, name), caption))


# What counts as a divergence, said in every caption where a diverged run can appear.
DIVERGED = ("† a run that diverged: an update left its update direction or weights NaN or infinite, or grew its largest "
            "|weight| 10-fold with the engine's sync check then failing (docs/method.md#diverged-runs); its final accuracy "
            "counts as 0 and its M is over its probe steps before the divergence.")
CAPTIONS = {
    "noise_floor": (
        "Deviation from on-policy training in multiples of the noise floor: per run M = sum dev / sum floor over its "
        "probe steps; per cell the mean over runs with its 95 % t-interval over runs (df = runs − 1, "
        "docs/method.md#intervals-over-seeds). " + DIVERGED
    ),
    "accuracy": (
        "{measure}: of θ_0 and at the last step, and the rise between them, mean [95 % t-interval over runs (df = "
        "runs − 1, docs/method.md#intervals-over-seeds)]; beside it, where measured, the held-out accuracy (greedy) "
        "of the same runs. " + DIVERGED
    ),
    "ess_crossing": (
        "First step with lag ESS < 1/2 (empirical, on the fresh batch), the step the Gaussian prediction exp(-Var "
        "lag) crosses, and the step `is` leaves the floor (3-step moving average of dev/floor > 2). " + DIVERGED
    ),
    "resync": (
        "Steps at which each run with resync resynchronized its sampler. " + DIVERGED
    ),
    "off_support": (
        "Off-support share (tokens of the trainer's own responses with probability < 1e-3 under the initial policy) "
        "before / at collapse points (accuracy drop >= half the bf16/pg reference), beside the sampler-side KL. "
        "Copied cells (computed_as) count once; a diverged run counts with its eval steps before the divergence."
    ),
    "spearman": (
        "Spearman correlation with the accuracy drop over (run, eval step) pairs of non-reference runs, copied cells "
        "counted once, a diverged run with its eval steps before the divergence; 95 % percentile-bootstrap intervals "
        "resample runs (1,000 resamples)."
    ),
    "probe_density": (
        "How the cells' M t-intervals over runs narrow with probe steps: the same runs with only every k-th probe "
        "step kept (probes never change a run)."
    ),
    "zoo": (
        "The grid's corrections ranked per sampler by the noise-floor multiple M (mean over runs [95 % t-interval "
        "over runs (df = runs − 1, docs/method.md#intervals-over-seeds)]; rank 1 = closest to on-policy training), "
        "beside the final {measure} (mean [95 % t-interval]) and its rank, the mean share of tokens each correction "
        "truncated or dropped and its largest token weight. The rank by M is over the cells whose runs all finished "
        "with every probe step in M (equal means share a rank); a cell with a diverged run, or with probe steps left "
        "out of M (a run that collapsed: floor 0), is listed after them without a rank (—). " + DIVERGED
    ),
    "findings": (
        "Findings of the paper, each checked by the stated rule over every seed run (`seeds`), one verdict per finding: "
        "✓ seen = the whole interval on the paper's side, ✗ contradicted = on the other side, ? undecided = it straddles "
        "the bound (seeds to decide: the seeds that would decide it with 80 % power at the observed spread, towards which "
        "verdict, and over the spread's own 95 % interval); multiples and ratios of multiples on the log scale "
        "(geometric mean [interval]); every interval at {level} %, the level of the sequential design (Bonferroni over "
        "its planned looks); an agreement is seen only with its whole interval inside the stated margin; the groups of "
        "seeds beside it are judged alone as a display of stability, not a second vote; other machines: their verdicts "
        "under the same rules, never this machine's relabelled (docs/method.md#three-verdicts). Rules of commit {rules}; "
        "computed on {machine}{model}."
    ),
}


def absent(df: pd.DataFrame, why: str) -> pd.DataFrame:
    """`df`, or where it has no rows (the grid lacks the cells it needs) a one-row table saying why."""
    return df if len(df) else pd.DataFrame({"not in this grid": [why]})


def write_all(steps: pd.DataFrame, runs: pd.DataFrame, out: Path, n_boot: int = 1000, replicates: list[list[int]] | None = None,
              other_machines: list[pd.DataFrame] | None = None, machine: str | None = None) -> dict[str, pd.DataFrame]:
    """Every table outputs.TABLES lists into `out`, in its order, and the findings input
    (outputs.FINDINGS_INPUT) the findings table is computed from as written (`findings_from`), so that
    `python -m dlcrepro findings --from out` rebuilds it; `other_machines`: findings tables of the same
    grid from other CPU kinds, whose verdicts turn a finding seen on one kind only into "seen on one
    machine"; `machine`: the CPU kind that ran these runs (findings.cpu_kind() by default)."""
    out = Path(out)
    write_findings_input(out, *findings_input(steps, runs, replicates, machine))
    pr = A.per_run(steps, runs)
    drops = A.distinct_runs(A.accuracy_drops(steps), runs)
    distinct_steps = A.distinct_runs(steps, runs)
    name = A.accuracy_names(steps, runs)
    t = {
        "noise_floor": noise_floor_table(steps, pr),
        "accuracy": accuracy_table(pr, name, A.final_heldout(steps, pr)),
        "ess_crossing": absent(ess_crossing_table(pr), f"no `is` run under a lagged sampler ({', '.join(lagged_samplers())})"),
        "resync": absent(resync_table(pr), "no run of a correction with resync (dlc, is_resync)"),
        "off_support": absent(off_support_table(drops), "no accuracy drops: they need the bf16/pg reference and another cell"),
        "spearman": absent(spearman_out(distinct_steps, drops, n_boot),
                           "no accuracy drops: they need the bf16/pg reference and another cell"),
        "probe_density": A.interval_width_by_probe_density(steps),
        "findings": findings_from(out, other_machines or [], n_boot),
        "zoo": zoo_table(steps, pr, name),
    }
    listed = [o.name for o in outputs.TABLES]  # the one list of outputs: what the workflow expects written
    if set(t) != set(listed):
        raise LookupError(f"dlcrepro/report/outputs.py lists the tables {sorted(set(listed) - set(t))} that tables.write_all "
                          f"does not build, and write_all builds {sorted(set(t) - set(listed))} that the list lacks")
    for name in listed:
        write_table(t[name], out, name, caption(name, t[name]).replace("{measure}", A.eval_measure(steps, runs)))
    return {name: t[name] for name in listed}


# ----------------------------------------------------------------------------- what the findings read

FLOAT_FORMAT = "%.10g"  # the findings input's numbers: 10 significant digits (a quarter smaller than Python's repr)


def write_findings_input(out: Path, steps: pd.DataFrame, runs: pd.DataFrame) -> None:
    """The findings input (findings.findings_input's two tables) as outputs.FINDINGS_INPUT in `out`."""
    for name, df in zip(outputs.FINDINGS_INPUT, (steps, runs)):
        atomic_write_text(Path(out) / name, df.to_csv(index=False, float_format=FLOAT_FORMAT))


def read_findings_input(directory: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The findings input a tables job wrote into `directory`: (per run and step, per run)."""
    paths = [Path(directory) / name for name in outputs.FINDINGS_INPUT]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"no findings input {', '.join(missing)}: the tables job writes it (`python -m dlcrepro "
                                "tables`); a study's tables from before it have none")
    steps, runs = (pd.read_csv(p) for p in paths)
    return steps, runs


def findings_from(directory: Path, other_machines: list[pd.DataFrame], n_boot: int = 1000) -> pd.DataFrame:
    """The findings table computed from the findings input in `directory` alone, beside what other
    CPU kinds gave (findings.across_machines): what the tables job writes as findings.csv, and what
    `python -m dlcrepro findings --from directory` rebuilds."""
    return across_machines(findings_from_input(*read_findings_input(directory), n_boot), other_machines)


def read_findings_table(path: Path) -> pd.DataFrame:
    """A findings.csv with its text columns as text: a rules commit such as "4e67747" is a number to
    pandas' reader (4e+67747), a verdict column of "1" or "nan" is not."""
    return pd.read_csv(path, dtype={"rules": str, "machine": str, "seen": str, "verdict": str})


def other_machine_findings(paths, n_boot: int = 1000) -> list[pd.DataFrame]:
    """The findings tables of other CPU kinds from `paths` (outputs.other_machine_files): a findings
    table as it is, a findings input (its findings_steps.csv or findings_runs.csv) recomputed under
    the current rules, once per folder."""
    tables, folders = [], []
    for p in map(Path, paths):
        if p.name in outputs.FINDINGS_INPUT:
            if p.parent not in folders:
                folders.append(p.parent)
        else:
            tables.append(read_findings_table(p))
    return tables + [findings_from_input(*read_findings_input(d), n_boot) for d in folders]


def caption(name: str, df: pd.DataFrame) -> str:
    """A table's caption; the findings table's also names the groups of seeds that did not run (their
    column says "not run"), since its verdicts then pool fewer seeds than the config asks for."""
    text = CAPTIONS[name]
    if name == "findings" and len(df) and {"rules", "machine"} <= set(df.columns):
        text = text.replace("{rules}", str(df["rules"].iloc[0])).replace("{machine}", str(df["machine"].iloc[0]))
        text = text.replace("{level}", f"{100 * float(df['level'].iloc[0]):.2f}" if "level" in df else "95")
        models = sorted(set(df["model"].astype(str))) if "model" in df else []
        text = text.replace("{model}", f"; model {models[0]}" if len(models) == 1 else "")
    missing = replicates_not_run(df) if name == "findings" else []
    if not missing:
        return text
    return text + f" Not run in this grid: {'; '.join(missing)}; the verdicts pool the seeds that ran."
