"""The study's outputs: every table and figure the workflow's default target writes, each with its
caption in the Snakemake report (`snakemake --report report.html`). One list, read by the workflow
(its rules' output files and report entries: workflow/rules/common.smk), by `figures.write_all` (what
it draws) and by the tests (what a run must write: tests/test_outputs.py ties them together).

Torch-free and plotting-free, like grid.py and registry.py: the Snakefile imports it. Adding a
figure is a function in figures.py under `@draws` and an entry in FIGURES here (docs/extending.md,
"Adding a figure"); a table, a function in tables.py's `write_all` and its caption there, and an entry in
TABLES.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# A kind of output: the formats each is written in, the one the report shows, the report's category.
FORMATS = {"table": ("tex", "md", "csv"), "figure": ("pdf", "png")}
REPORTED = {"table": "csv", "figure": "png"}
CATEGORY = {"table": "Tables", "figure": "Figures"}


@dataclass(frozen=True)
class Output:
    """A table or figure of the study: `name` is its files' stem (for a figure, also the name
    figures.py registers its drawing function under, `@draws(name)`: `fn(steps, runs) -> Figure`, or
    `fn(findings) -> Figure` for one that reads the findings table), `caption` what the report says
    of it (reStructuredText)."""

    name: str
    kind: str  # "table" or "figure"
    caption: str
    reads: str = "runs"  # a figure's input: "runs" (fn(steps, runs)), "findings" (fn(findings table)) or "comparison" (reproduce)

    def files(self, directory) -> list[str]:
        """Its files in `directory`, one per format (FORMATS)."""
        return [f"{directory}/{self.name}.{ext}" for ext in FORMATS[self.kind]]

    def reported(self, path: str) -> bool:
        """Whether `path`, one of its files, is the one the report shows."""
        return path.endswith(f".{REPORTED[self.kind]}")

    @property
    def category(self) -> str:
        return CATEGORY[self.kind]


# Said of every figure that draws a line per cell (a figure's caption ends with it).
PER_CELL = (
    "A thick line is the mean over a cell's runs that finished, a thin line each seed (the title gives the seed "
    "count); a run that diverged ends in a cross at its last step and stays out of the mean and the axis limits; "
    "a model's four panels stand in two rows of two; every mark is named in the legend (docs/results.md, "
    '"Reading the figures"); a '
    "correction has the same colour, line style and marker in every figure (a family shares a colour); hollow "
    "markers without a line are a cell copied from the run it equals (dlcrepro/core/grid.py), drawn over it and named so "
    "in the legend."
)

TABLE_CAPTION = (
    'A table of the paper reproduction (see SPEC.md "Outputs"); the paper\'s number stands beside ours where PAPER.md '
    "reports one. The .tex and .md versions are in paper_tables/."
)


def table(name: str, caption: str = "") -> Output:
    """A table (tables.write_all writes it); the report's caption TABLE_CAPTION unless given."""
    return Output(name, "table", caption or TABLE_CAPTION)


def figure(name: str, caption: str, reads: str = "runs") -> Output:
    """A figure, drawn by the function figures.py registers as `name` from the runs or the findings table."""
    return Output(name, "figure", caption, reads)


# In the order tables.write_all writes them.
TABLES = (
    table("noise_floor"),
    table("accuracy"),
    table("ess_crossing"),
    table("resync"),
    table("off_support"),
    table("spearman"),
    table("probe_density"),
    table("findings"),
    table("zoo"),
)

# What the findings read, written by the tables job beside the tables (tables.write_findings_input):
# per run and step, and per run. findings.csv is computed from them as written, so
# `python -m dlcrepro findings --from <tables_dir>` rebuilds it from these files alone.
FINDINGS_INPUT = ("findings_steps.csv", "findings_runs.csv")


def findings_input_files(directory) -> list[str]:
    """The findings input's files in `directory` (the tables job's outputs beside TABLES')."""
    return [f"{directory}/{name}" for name in FINDINGS_INPUT]


def other_machine_files(tables_dir) -> list[str]:
    """What other kinds of CPU give for the same grid, committed under <tables_dir>/other_machines/
    (docs/method.md#across-machines): findings tables (`*.csv`), or a study's findings input in a
    folder of its own (`<name>/findings_steps.csv`, `<name>/findings_runs.csv`: recomputed under the
    current rules). Read by the tables job and by `findings --from`."""
    d = Path(tables_dir) / "other_machines"
    return sorted(str(p) for p in d.glob("*.csv")) + sorted(str(p) for name in FINDINGS_INPUT for p in d.glob(f"*/{name}"))


# In the order figures.write_all draws them.
FIGURES = (
    figure(
        "mismatch",
        "Mean absolute numerical discrepancy δ (left) and policy lag λ (right) per step and sampler, in nats per "
        "token, averaged over the sampler's distinct runs that finished (a copied cell once), with the 95 % t-interval "
        "of that mean over runs as a band; a run that diverged ends in a cross and stays out of the "
        "mean and the axis limits, as does a run off the scale (1,000 times the median run's largest: a triangle on "
        "the top edge): δ is the engine's rounding and stays roughly flat; λ grows while a stale sampler is not synced.",
    ),
    figure(
        "mismatch_split",
        "The training–inference mismatch a framework logs as one number, split: verl's k3_kl (mean over tokens of "
        "e^δ − 1 − δ, prime-rl's mismatch_kl) of the discrepancy (engine against the trainer at the sampler's weights, "
        "left) and of the lag (the trainer at the sampler's weights against its current ones, right) per step and "
        "sampler, in nats per token on a scale linear below 10⁻⁶ and logarithmic above, averaged over the sampler's "
        "distinct runs that finished (a copied cell once), with the 95 % t-interval of that mean over runs as a band "
        "(docs/method.md, \"The frameworks' mismatch metrics\"); a run that diverged ends in a cross, a run off the "
        "scale is a triangle on the top edge.",
    ),
    figure(
        "ess",
        "Lag ESS of each fresh batch under the lagged samplers (thick, with markers) with its Gaussian prediction "
        "exp(−Var λ) (thin, same colour) and the ESS 1/2 line at which IS fails (F1, F2). "
        + PER_CELL,
    ),
    figure(
        "noise_floor",
        "Deviation from on-policy training per step, dev/floor (3-step moving average, log scale), per correction "
        'and sampler; the grey lines are the noise floor (1×) and the "left the floor" threshold (2×), named in the'
        " legend; the paper's M for a cell is a diamond in the shaded strip right of the last step. "
        + PER_CELL,
    ),
    figure(
        "accuracy",
        "Test accuracy from θ_0's (step 0) through the eval steps, every panel over the same steps, per correction "
        "and sampler, in the measure the config chooses "
        "(train.eval_on, train.eval_mode, train.eval_samples), which the y-axis and the title name as recorded in "
        "the runs table (e.g. RL-pool accuracy (sampled), 8 answers per problem at temperature 1; held-out accuracy "
        "(greedy) where the test set is held out). "
        + PER_CELL,
    ),
    figure(
        "off_support_kl",
        "The invisible collapse: the trainer-side off-support share (top panels) rises where accuracy collapses, "
        "while the sampler-side KL on the sampler's own prefixes (bottom panels) stays in the range of healthy runs "
        "(F11, F12); a run off the KL scale (1,000 times the median run's largest) is a triangle on the top edge; "
        "the legend marks the corrections that resync. "
        + PER_CELL,
    ),
    figure(
        "off_support_drop",
        "Off-support share against the accuracy drop relative to bf16/pg (same model, seed and step), a panel per "
        "sampler, one point per (run, eval step), copied cells once, with Spearman ρ over all points in the title "
        "(F13).",
    ),
    figure(
        "learning",
        "Why the on-policy reference learns: bf16/pg's accuracies, a line per seed, from the warm start on (RL-pool "
        "accuracy (sampled), RL-pool accuracy (greedy), held-out accuracy (greedy)), the training reward of pg under "
        "each sampler, pass@1, pass@k and the share of mixed-reward groups of bf16/pg's batches, and the on-policy "
        "gradient's signal-to-noise ratio at probe steps against the SNR 1 line (thick line: mean over seeds, thin "
        "lines: each seed).",
    ),
    figure(
        "findings",
        "The paper's fifteen findings against this study, from the findings table (paper_tables/findings.csv): per "
        "finding the paper's value, each replicate's headline number on a green ground where it is seen, red where "
        "contradicted, yellow where undecided (its interval straddles the rule), and the verdict (seen: seen in every "
        "replicate; an agreement only with its whole interval inside the stated margin; seen on one machine: on one "
        "kind of CPU and not another); each number in its unit, brackets an interval and parentheses the range of "
        "the runs, as the legend says. Beside it the noise-floor multiples on one log axis: each replicate's mean "
        "with its interval over seeds "
        "against the paper's value (a red diamond). The title names the commit of the rules and the CPU kind that "
        "computed them (docs/method.md#three-verdicts).",
        reads="findings",
    ),
)


# What the `reproduce` rule writes at the end of every run (dlcrepro/report/reproduce.py): whether the run
# reproduced the committed study, cell by cell. Not one of FIGURES (figures.write_all does not draw it):
# its figure is drawn from the comparison, into the run's figures directory, beside the report.
REPRODUCTION = figure(
    "reproduce",
    "This run against the committed study (docs/workflow.md#did-the-run-reproduce-the-committed-study): a mark per "
    "cell, green where every number of its findings input equals the committed study's, red where one differs, grey "
    "where the committed study lacks the cell; beside it, where the cells differ or the CPU kinds do, each finding's "
    "verdict in this run and in the committed study over the cells both hold. The title is the run's last line.",
    reads="comparison",
)
REPRODUCTION_REPORT = "reproduce.md"  # in the run's tables directory
