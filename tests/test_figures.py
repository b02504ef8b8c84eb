"""Figures that read alone, checked on the matplotlib Figure objects (not pixels): a style per
correction, copies named, the seed count in a caption of at most two lines, every mark and reference
line named in the legend, the legend beside the panels, the accuracy's measure on its axis, panels
that read at a page's width (two across), axes that a blown-up run does not set."""

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.text import Text

from dlcrepro.report import analysis as A
from dlcrepro.report import figures as F
from dlcrepro.report import outputs
from dlcrepro.core.registry import CORRECTION_INFO

from test_analysis import NAN, run_rows

FROM_RUNS = [o.name for o in outputs.FIGURES if o.reads == "runs"]  # the figures drawn from the steps and runs


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def study(cells, seeds=(0,), copies=None):
    """Steps and runs over `cells` [(sampler, correction)], 4 steps, a probe and an eval at each;
    `copies` {(sampler, correction): source correction} marks copied cells as collect does."""
    copies = copies or {}
    steps = pd.concat([
        run_rows("tiny", s, c, k, dev=[1.0 + k, 2.0, 3.0, 4.0 + k], test_accuracy=[0.2, 0.3 + 0.05 * k, 0.3, 0.4],
                 accuracy_sampled=[0.2, 0.3 + 0.05 * k, 0.3, 0.4], accuracy_greedy=[0.1] * 4, heldout_accuracy_greedy=[0.1] * 4,
                 ess_lag=[1.0, 0.8, 0.6, 0.4], ess_lag_gauss=[1.0, 0.7, 0.5, 0.3], off_support=[0.0, 0.1, 0.0, 0.2],
                 discrepancy_mean_abs=[0.01] * 4, lag_mean_abs=[0.0, 0.1, 0.2, 0.3], reward_mean=[-0.4, -0.2 + 0.1 * k, 0.0, 0.1],
                 pass_at_1=[0.3] * 4, pass_at_k=[0.6] * 4, mixed_groups=[0.5] * 4, grad_snr=[2.0, 1.5, 1.0 + k, 0.8],
                 mismatch_discrepancy_k3_kl=[1e-4] * 4,
                 mismatch_lag_k3_kl=[0.0] * 4 if s in ("bf16", "fp8") else [0.0, 0.01, 0.05 + 0.01 * k, 0.1])
        for s, c in cells for k in seeds
    ])
    runs = steps.groupby(A.RUN).agg(final_test_accuracy=("test_accuracy", "last")).reset_index()
    runs["computed_as"] = [f"results/tiny/{s}/{copies[(s, c)]}/seed{k}" if (s, c) in copies else ""
                           for s, c, k in zip(runs["sampler"], runs["correction"], runs["seed"])]
    return steps, runs


def title(fig) -> str:
    """The figure's title, its lines (wrapped to the figure's width) joined by spaces."""
    return " ".join(fig.get_suptitle().split())


def legend_texts(fig) -> list[str]:
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def test_the_palette_keeps_every_registered_correction_apart_and_a_family_in_one_hue():
    styles = F.correction_styles()
    assert set(styles) == set(CORRECTION_INFO) and len(styles) >= 14
    assert len({(s.color, s.linestyle) for s in styles.values()}) == len(styles)  # colour and line style alone
    assert len({(s.color, s.marker) for s in styles.values()}) == len(styles)  # colour and marker alone (scatter)
    families = {}
    for s in styles.values():
        families.setdefault(s.family, set()).add(s.color)
    assert all(len(colours) == 1 for colours in families.values())  # a family shares its hue
    assert len({c for colours in families.values() for c in colours}) == len(families)  # and no other family has it
    assert styles["is"].color == styles["is_resync"].color and styles["is"].linestyle != styles["is_resync"].linestyle
    # the five a reader could not tell apart in the zoo's accuracy figure
    five = [styles[c] for c in ("icepop", "is", "is_center", "is_resync", "pg")]
    assert len({(s.color, s.linestyle) for s in five}) == 5


def test_a_correction_outside_the_registry_is_a_family_of_its_own():
    styles = F.correction_styles(["halved_pg"])
    assert styles["halved_pg"].family == "halved_pg"
    assert styles["halved_pg"].color not in {s.color for n, s in styles.items() if n != "halved_pg"}
    assert F.correction_styles()["pg"] == styles["pg"]  # the others keep their style


def test_a_copied_cell_is_named_in_the_legend_and_drawn_hollow_over_its_source():
    cells = [(s, c) for s in ("bf16", "stale") for c in ("pg", "ppo", "is_center", "dlc")]
    copies = {("bf16", "ppo"): "pg", ("stale", "ppo"): "pg", ("bf16", "dlc"): "is_center"}
    steps, runs = study(cells, seeds=(0, 1), copies=copies)
    fig = F.noise_floor(steps, runs)
    texts = legend_texts(fig)
    assert "ppo (= pg)" in texts  # a copy under every sampler it ran under
    assert "dlc (= is_center under bf16)" in texts  # under stale it is a run of its own
    assert "pg" in texts and "is_center" in texts
    assert F.COPY_MARK[0] in texts  # the hollow markers, named in the legend
    bf16 = fig.axes[0]
    hollow = [ln for ln in bf16.get_lines() if ln.get_markerfacecolor() == "none"]
    assert len(hollow) == 2  # ppo and dlc, drawn after (over) pg and is_center
    assert all(ln.get_zorder() > 2 and ln.get_linestyle() == "None" for ln in hollow)  # markers only: the source's line shows
    thin = [ln for ln in bf16.get_lines() if ln.get_linewidth() == 0.6]
    assert len(thin) == 4  # a thin line per seed for pg and is_center; their copies' would be the same lines


def thin_lines(ax) -> list:
    return [ln for ln in ax.get_lines() if ln.get_linewidth() == 0.6]


def test_the_title_states_the_seed_count_and_every_seed_is_a_thin_line():
    steps, runs = study([("bf16", "pg"), ("stale", "is")], seeds=(0, 1, 2))
    fig = F.noise_floor(steps, runs)
    assert "mean of the finished runs (3 seeds per cell), thin lines: each seed" in title(fig)
    assert "band" not in title(fig) and not any(ax.collections for ax in fig.axes)  # no min–max shading
    assert all(len(thin_lines(ax)) == 3 for ax in fig.axes)
    one, runs1 = study([("bf16", "pg")], seeds=(0,))
    fig1 = F.accuracy(one, runs1)
    assert "1 seed per cell" in title(fig1) and not thin_lines(fig1.axes[0])


def test_a_diverged_run_ends_in_a_cross_and_moves_neither_the_mean_nor_the_axis():
    steps, runs = study([("stale", "is")], seeds=(0, 1, 2))
    blown = (steps["seed"] == 2) & (steps["step"] == 3)
    steps.loc[blown, ["dev", "dev_ratio"]] = 1e6  # seed 2 blows up at step 3 and diverges at step 4: no row
    steps = steps.loc[~((steps["seed"] == 2) & (steps["step"] == 4))]
    runs["diverged_at_step"] = [4.0 if k == 2 else NAN for k in runs["seed"]]
    fig = F.noise_floor(steps, runs)
    ax = fig.axes[0]
    crosses = [a for a in ax.get_children() if isinstance(a, F.Line2D) and a.get_marker() == "x"]
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [3]
    assert ax.get_ylim()[1] < 1e3  # the blown-up step sets no axis limit
    mean = next(ln for ln in ax.get_lines() if ln.get_linewidth() == 1.4)
    assert max(mean.get_ydata()) < 10  # nor the mean
    assert F.DIVERGED_MARK[0] in legend_texts(fig) and "no run diverged" not in title(fig)


def test_a_run_that_diverged_before_its_first_eval_keeps_a_cross_at_its_step_on_the_bottom_edge():
    """The zoo's lagged ppo_multi runs diverge at steps 5-9, before the first eval (step 8): their
    accuracy has no row at all. Each still gets its cross, at the step it diverged, on the panel's
    bottom edge (no accuracy implied), inside the x range; a correction whose every run diverged so
    keeps its colour and its legend entry."""
    steps, runs = study([("stale", "pg"), ("stale", "ppo_multi")], seeds=(0, 1))
    steps["test_accuracy"] = steps["test_accuracy"].where(steps["step"] >= 3)  # evals at steps 3 and 4
    multi = steps["correction"] == "ppo_multi"
    steps = steps.loc[~multi | (steps["step"] < 2)]  # both ppo_multi runs trained step 1 and diverged at step 2
    runs["diverged_at_step"] = [2.0 if c == "ppo_multi" else NAN for c in runs["correction"]]
    fig = F.accuracy(steps, runs)
    ax = fig.axes[0]
    crosses = [a for a in ax.get_children() if isinstance(a, F.Line2D) and a.get_marker() == "x"]
    colour = F.correction_styles(["pg", "ppo_multi"])["ppo_multi"].color
    assert len(crosses) == 2 and all(list(c.get_xdata()) == [2.0] and list(c.get_ydata()) == [0.0] for c in crosses)
    assert all(c.get_transform() == ax.get_xaxis_transform() and c.get_color() == colour for c in crosses)
    fig.canvas.draw()
    assert ax.get_xlim()[0] < 2.0 < ax.get_xlim()[1]  # seen, though the panel's first eval is at step 3
    assert "ppo_multi" in legend_texts(fig)
    assert F.UNMEASURED_MARK[0] in legend_texts(fig)


def test_the_papers_values_are_marked_where_a_figure_shows_what_it_reports():
    steps, runs = study([("bf16", "pg"), ("stale", "is"), ("stale", "dlc")])
    nf = F.noise_floor(steps, runs)
    stale = next(ax for ax in nf.axes if ax.get_title().endswith("/ stale"))
    diamonds = sorted(float(ln.get_ydata()[0]) for ln in stale.get_lines() if ln.get_marker() == "D")
    assert diamonds == [1.9, 115.0]  # F8 (dlc) and F10 (is)
    ess = F.ess(steps, runs)
    assert sorted(ln.get_xdata()[0] for ax in ess.axes for ln in ax.get_lines() if ln.get_color() == F.PAPER_COLOUR) == [11, 14]


def test_the_summary_figure_sets_each_finding_beside_the_paper():
    from dlcrepro.report import findings as FD

    steps, runs = study([("bf16", "pg"), ("fp8", "pg"), ("fp8", "center"), ("stale", "is"), ("stale", "dlc")], seeds=(0, 1, 2, 3))
    runs["initial_test_accuracy"], runs["resync_steps"] = 0.1, "[]"
    table = FD.findings_table(steps, runs, [[0, 1], [2, 3]], n_boot=50)
    fig = F.findings(table)
    grid, forest = fig.axes[:2]
    texts = [t.get_text() for t in grid.texts]
    assert sum(t.startswith(("F", "R:", "M:")) and ":" in t for t in texts) == len(FD.FINDINGS)
    assert all(v in texts for v in table["verdict"])
    assert [t.get_text() for t in forest.get_yticklabels()] == ["F3", "F5", "F6", "F7", "F8", "F10"]
    assert any(ln.get_marker() == "D" and ln.get_xdata()[0] == 13.0 for ln in forest.get_lines())  # the paper's F3
    # R's rise is an interval over seeds now, in brackets, in points
    r = next(t for t in texts if t.startswith(("✓ +", "✗ +", "? +", "✓ -", "✗ -", "? -")) and "points" in t)
    assert "[" in r and "(runs " not in r


def test_the_papers_multiples_stand_right_of_the_data_and_their_labels_do_not_overprint():
    """The stale panel's six paper values (1.9, 2.1, 2.6, 32, 115, 699): diamonds and labels in a strip
    right of the last step, where no line runs, the labels of 1.9, 2.1 and 2.6 spread apart."""
    cells = [(s, c) for s in ("bf16", "stale") for c in ("pg", "center", "is", "is_center", "ppo_multi", "dlc", "is_resync")]
    steps, runs = study(cells, seeds=(0, 1))
    fig = F.noise_floor(steps, runs)
    fig.canvas.draw()
    ax = next(a for a in fig.axes if a.get_title().endswith("/ stale"))
    last = steps["step"].max()
    diamonds = [ln for ln in ax.get_lines() if ln.get_marker() == "D"]
    assert len(diamonds) == 6 and all(ln.get_xdata()[0] > last for ln in diamonds)
    assert all(max(ln.get_xdata()) <= last for ln in ax.get_lines() if ln.get_marker() not in ("D", "None", ""))
    labels = [t for t in ax.texts if t.get_text().endswith("×")]
    boxes = [Text.get_window_extent(t) for t in labels]  # the words alone, not a moved label's leader
    assert len(labels) == 6 and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    data_right = ax.transData.transform((last, 1.0))[0]
    assert all(b.x0 > data_right for b in boxes)  # none over the data
    assert all(t <= last for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1])  # no step ticks in the strip


def test_the_accuracy_starts_at_step_0_and_every_panel_spans_the_same_steps():
    steps, runs = study([("bf16", "pg"), ("stale", "pg"), ("stale", "is")], seeds=(0, 1))
    steps["test_accuracy"] = steps["test_accuracy"].where(steps["step"] >= 2)
    runs["initial_test_accuracy"] = 0.25
    stale_is = (steps["sampler"] == "stale") & (steps["correction"] == "is")
    steps.loc[stale_is & (steps["step"] == 4), "test_accuracy"] = NAN  # this panel's last eval is at step 3
    fig = F.accuracy(steps, runs)
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    left, right = panels[0].get_xlim()
    assert len({ax.get_xlim() for ax in panels}) == 1 and left <= 0 and right >= 4
    means = [ln for ax in panels for ln in ax.get_lines() if ln.get_linewidth() == 1.4]
    assert all(ln.get_xdata()[0] == 0 and ln.get_ydata()[0] == 0.25 for ln in means)  # θ_0's accuracy at step 0


def test_a_blown_up_run_sets_neither_the_kl_nor_the_lag_axis_and_is_marked_off_the_scale():
    """The zoo's gspo reached a KL of 10^8 and a lag of 10^6 nats/token without diverging: out of the
    means and the axes, marked by a triangle on the top edge where it leaves the scale."""
    steps, runs = study([("stale", "pg"), ("stale", "is")], seeds=(0, 1, 2))
    steps["kl_sampler"] = 0.1 * steps["step"]
    blown = (steps["correction"] == "is") & (steps["seed"] == 2) & (steps["step"] >= 3)
    steps.loc[blown, ["kl_sampler", "lag_mean_abs"]] = 1e8
    for fig, y_label in ((F.off_support_kl(steps, runs), "nats/token"), (F.mismatch(steps, runs), "|lag λ|")):
        ax = next(a for a in fig.axes if y_label in a.get_ylabel())
        assert ax.get_ylim()[1] < 1e3, y_label
        top = [a for a in ax.get_children() if isinstance(a, F.Line2D) and a.get_marker() == "^"]
        assert len(top) == 1 and list(top[0].get_xdata()) == [3] and list(top[0].get_ydata()) == [1.0]
        assert F.OFF_SCALE_MARK[0] in legend_texts(fig)
    assert F.off_scale_runs(steps.loc[steps["correction"] == "pg"], "kl_sampler") == frozenset()  # none blown up: none off


def test_the_split_figure_draws_the_k3_of_the_discrepancy_and_of_the_lag_and_says_when_the_runs_lack_them():
    steps, runs = study([(s, "pg") for s in ("bf16", "stale")], seeds=(0, 1))
    fig = F.mismatch_split(steps, runs)
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["tiny: k3 KL of the discrepancy", "tiny: k3 KL of the lag"]
    lag = axes[1]
    means = sorted(list(line.get_ydata()) for line in lag.get_lines() if line.get_linewidth() == 1.4)  # a line per sampler
    assert means == [[0.0] * 4, pytest.approx([0.0, 0.01, 0.055, 0.1])]  # bf16 has no lag; stale's, the mean of two seeds
    assert "k3_kl" in title(fig) and "2 distinct finished runs" in title(fig)
    old = steps.drop(columns=["mismatch_discrepancy_k3_kl", "mismatch_lag_k3_kl"])  # a study collected before #68
    note = F.mismatch_split(old, runs)
    assert "not in these runs" in " ".join(t.get_text() for ax in note.axes for t in ax.texts)


def test_the_learning_figure_names_the_accuracy_by_what_the_config_measured():
    steps, runs = study([("bf16", "pg")], seeds=(0, 1))
    runs["initial_accuracy_sampled"], runs["initial_accuracy_greedy"] = 0.2, 0.1
    test = F.learning(steps.assign(heldout_accuracy_greedy=NAN), runs.assign(eval_on="test"))
    texts = [t.get_text() for ax in test.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert "held-out accuracy (sampled)" in texts and not any("RL-pool" in t for t in texts)
    pool = F.learning(steps, runs.assign(eval_on="pool"))
    texts = [t.get_text() for ax in pool.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert {"RL-pool accuracy (sampled)", "RL-pool accuracy (greedy)", "held-out accuracy (greedy)"} <= set(texts)


def test_the_summary_figure_brackets_only_intervals():
    row = pd.Series({"seeds 0 value": 30.0, "seeds 0 low": 20.0, "seeds 0 high": 40.0, "seeds 0": "✓ x",
                     "unit": "points of pool accuracy gained (mean, smallest and largest run)"})
    assert F._headline(row, "seeds 0") == "+30.0 points (runs +20.0 to +40.0)"
    interval = row.copy()
    interval["unit"] = "x floor"
    assert F._headline(interval, "seeds 0") == "30× [20, 40×]"


def test_every_headline_number_carries_its_unit():
    from dlcrepro.report import findings as FD

    for f in FD.FINDINGS:
        row = pd.Series({"seeds 0 value": 0.5, "seeds 0 low": NAN, "seeds 0 high": NAN, "seeds 0": "✓ x", "unit": f.unit})
        text = F._headline(row, "seeds 0")
        assert text not in ("0.5", "+0.5"), (f.id, text)
        assert any(text.startswith(fmt(0.5)) and text.endswith(words) for start, fmt, words in F.HEADLINE_UNITS
                   if f.unit.startswith(start)), (f.id, f.unit, text)


def test_the_summary_figure_tells_an_interval_from_a_range_in_its_legend_and_cuts_no_text():
    from dlcrepro.report import findings as FD

    steps, runs = study([("bf16", "pg"), ("fp8", "pg"), ("fp8", "center"), ("stale", "is"), ("stale", "dlc")], seeds=(0, 1, 2, 3))
    runs["initial_test_accuracy"], runs["resync_steps"] = 0.1, "[]"
    table = FD.findings_table(steps, runs, [[0, 1], [2, 3]], n_boot=50)
    assert FD.replicate_columns(table) == ["seeds 0,1", "seeds 2,3"]  # not "seeds to decide"
    fig = F.findings(table)
    texts = legend_texts(fig)
    from dlcrepro.report.sequential import DESIGN

    level = f"[a, b]: {100 * DESIGN.level:.2f} % t-interval"
    assert any(t.startswith(level) for t in texts) and any(t.startswith("(runs a to b)") for t in texts)
    assert len(fig.get_suptitle().splitlines()) == 2
    grid = fig.axes[0]
    assert not any("…" in t.get_text() for t in grid.texts)
    whats = " ".join(" ".join(t.get_text().split()) for t in grid.texts)
    assert all(f"{f.id}: {f.what}" in whats for f in FD.FINDINGS)  # each finding's words whole, wrapped at most
    old = table.drop(columns=["seeds to decide", "level", "result"], errors="ignore").assign(rules="69b9542")
    assert any("percentile bootstrap" in t and "69b9542" in t for t in legend_texts(F.findings(old)))


@pytest.mark.parametrize("name", FROM_RUNS)
def test_every_figure_has_a_title_with_its_seed_count(name):
    steps, runs = study([("bf16", "pg"), ("stale", "is"), ("stale", "dlc")], seeds=(0, 1))
    fig = F.FIGURES[name](steps, runs)
    assert "2 seeds" in title(fig) and len(fig.get_suptitle().splitlines()) >= 2  # what; then how


@pytest.mark.parametrize("name", FROM_RUNS)
def test_every_caption_is_at_most_two_lines_on_the_grid_with_every_correction_and_divergences(name):
    """What is plotted, then how, each one line at the figure's width; the marks are in the legend and
    the rest in docs/results.md (F.READING): a four-line caption over a strip does not read on a page."""
    cells = [(s, c) for s in ("bf16", "fp8", "stale", "fp8_stale") for c in CORRECTION_INFO]
    steps, runs = study(cells, seeds=(0, 1, 2), copies={(s, "ppo"): "pg" for s in ("bf16", "fp8", "stale", "fp8_stale")})
    runs["diverged_at_step"] = [3.0 if (c, k) == ("ppo_multi", 1) else NAN for c, k in zip(runs["correction"], runs["seed"])]
    fig = F.FIGURES[name](steps, runs)
    assert len(fig.get_suptitle().splitlines()) == 2, fig.get_suptitle()


@pytest.mark.parametrize("name", ["noise_floor", "accuracy", "off_support_kl", "off_support_drop", "learning"])
def test_four_panels_of_a_model_are_two_rows_of_two_not_a_strip(name):
    """A 1 × 4 strip (2,197 × 431 px) is unreadable at a page's width: two panels across."""
    steps, runs = study([(s, c) for s in ("bf16", "fp8", "stale", "fp8_stale") for c in ("pg", "is")], seeds=(0, 1))
    fig = F.FIGURES[name](steps, runs)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_subplotspec() is not None]
    assert len(panels) == 4
    assert len({ax.get_subplotspec().colspan.start for ax in panels}) == 2
    assert len({ax.get_subplotspec().rowspan.start for ax in panels}) == 2


def test_reference_lines_are_labelled_in_the_legend():
    steps, runs = study([("bf16", "pg"), ("stale", "is")])
    for fig, want in ((F.noise_floor(steps, runs), {"1× floor", "2× floor"}), (F.ess(steps, runs), {"ESS 1/2"})):
        flat = {ln.get_label() for ax in fig.axes for ln in ax.get_lines()
                if len(ln.get_xdata()) > 1 and len(set(ln.get_ydata())) == 1}
        assert flat == want  # every horizontal line carries its name
        assert all(any(t.startswith(w) for t in legend_texts(fig)) for w in want)


def test_the_legend_sits_beside_the_panels_not_over_them():
    cells = [(s, c) for s in ("bf16", "fp8", "stale", "fp8_stale") for c in CORRECTION_INFO]
    steps, runs = study(cells)
    for f in (F.noise_floor, F.accuracy, F.ess, F.off_support_kl):
        fig = f(steps, runs)
        fig.canvas.draw()
        (leg,) = fig.legends
        box = leg.get_window_extent()
        assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes if ax.get_visible()), f.__name__
        assert not box.overlaps(fig._suptitle.get_window_extent()), f.__name__  # nor its title on the caption
        assert not any(ax.get_legend() for ax in fig.axes)


def test_the_accuracy_axis_says_what_is_measured():
    steps, runs = study([("bf16", "pg")])
    runs = runs.assign(eval_on="pool", eval_mode="sampled", eval_samples=8, eval_problems=64)
    fig = F.accuracy(steps, runs)
    want = "RL-pool accuracy (sampled): 64 problems, 8 answers each at T = 1"
    assert fig.axes[0].get_ylabel().startswith("RL-pool accuracy (sampled)") and want in title(fig)
    held = runs.assign(eval_on="test", eval_mode="greedy", eval_problems=256)
    assert A.eval_measure(steps, held) == "held-out accuracy (greedy): 256 problems, one greedy answer each"
    # a runs table collected before it recorded the setting: read off the steps table
    assert A.eval_measure(steps, runs.drop(columns=["eval_on", "eval_mode", "eval_samples", "eval_problems"])) == \
        "RL-pool accuracy (sampled)"
    steps.loc[:, "heldout_accuracy_greedy"] = NAN
    steps["accuracy_greedy"] = steps["test_accuracy"]
    assert A.eval_measure(steps, None) == "test accuracy: train.eval_on / eval_mode not recorded"  # both columns repeat it


def test_a_study_whose_updates_never_moved_draws_every_figure_saying_what_is_missing(tmp_path):
    """A short study from a weak model (the Slurm test's 60-step warm start): every group's rewards
    equal, so dev and floor are 0 at every probe and dev/floor is undefined. Each figure is written;
    the noise floor says it has nothing to draw instead of failing the figures job."""
    steps, runs = study([("fp8", "pg"), ("stale", "pg")])
    steps["dev"], steps["floor"], steps["dev_ratio"] = 0.0, 0.0, NAN
    F.write_all(steps, tmp_path, runs)
    for o in outputs.FIGURES:
        if o.name != "findings":  # drawn from the findings table, not given here
            assert (tmp_path / f"{o.name}.png").stat().st_size > 0, o.name
    texts = [t.get_text() for t in F.noise_floor(steps, runs).axes[0].texts]
    assert texts and "nothing to draw" in texts[0]
