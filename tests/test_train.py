"""One training cell through the CLI, on the smoke config and the real engines."""

import json
import os
import re
import signal
import subprocess
import sys

import pandas as pd
import pytest

from conftest import ROOT, SMOKE, small_model_dir, wait_for

pytestmark = pytest.mark.slow

SPEC_COLUMNS = {
    "step", "reward_mean", "response_len_mean", "sync_version", "resync",
    "ess_lag", "ess_lag_gauss", "ess_lag_seq", "ess_total",
    "discrepancy_mean", "discrepancy_mean_abs", "discrepancy_std", "lag_mean", "lag_mean_abs", "lag_std",
    "kl_sampler", "dev", "floor", "dev_ratio", "off_support", "test_accuracy",
}
LEARNING_COLUMNS = {
    "pass_at_1", "pass_at_k", "mixed_groups", "grad_signal", "grad_snr",
    "accuracy_greedy", "accuracy_sampled", "heldout_accuracy_greedy",
}


def train_cmd(model_dir, out, sampler="stale", correction="dlc", *sets):
    cmd = [sys.executable, "-m", "dlcrepro", "train", "--config", str(SMOKE), "--model-dir", str(model_dir),
           "--sampler", sampler, "--correction", correction, "--seed", "0", "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(autouse=True)
def via_fork_server(fork_server, monkeypatch):
    """Every `python -m dlcrepro train|rollouts|initial-eval` here runs as a child of the test run's
    fork server ($DLCREPRO_SERVER, tests/conftest.py): the same `cli.main` without ~10 s of imports
    and teardown each, and with the threads a job of its own would have (the server's children take
    OMP_NUM_THREADS, 1 where it is unset)."""
    import torch

    monkeypatch.setenv("DLCREPRO_SERVER", fork_server)
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))


def own_process_env() -> dict[str, str]:
    """The environment of a job that runs in its own process (one the test kills: SIGKILL leaves the
    server's child to notice the closed connection)."""
    return {k: v for k, v in os.environ.items() if k != "DLCREPRO_SERVER"}


def test_cell_writes_metrics_config_summary_and_log(tiny_model_dir, tmp_path):
    out = tmp_path / "cell"
    p = run(train_cmd(tiny_model_dir, out, "fp8_stale", "dlc"))
    assert p.returncode == 0, p.stderr[-3000:]
    df = pd.read_parquet(out / "metrics.parquet")
    assert SPEC_COLUMNS | LEARNING_COLUMNS <= set(df.columns)
    assert list(df["step"]) == [1, 2, 3, 4]
    # the smoke config evaluates sampled accuracy on its 16-problem RL pool, held-out greedy beside it
    ev = df.loc[df["test_accuracy"].notna()]
    assert (ev["test_accuracy"] == ev["accuracy_sampled"]).all() and ev["heldout_accuracy_greedy"].notna().all()
    assert ((df["pass_at_1"] <= df["pass_at_k"]) & (df["mixed_groups"] <= df["pass_at_k"])).all()
    assert {"sec_sample", "sec_probe", "sec_correction"} <= set(df.columns)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and 0 <= summary["final_test_accuracy"] <= 1
    assert summary["initial_test_accuracy"] == summary["initial_accuracies"]["accuracy_sampled"]
    assert set(summary["seconds_by_phase"]) >= {"sample", "probe", "eval"}
    assert (out / "config.yaml").exists() and "starting" in (out / "train.log").read_text()
    assert not (out / "checkpoint.pt").exists()  # only kept as long as a resume needs it
    # accuracy at eval steps only; the first step is at θ_0 exactly: no lag
    assert df["test_accuracy"].notna().tolist() == [False, True, False, True]
    assert df.loc[0, "lag_mean_abs"] == 0.0 and df.loc[0, "ess_lag"] == 1.0
    assert (df["discrepancy_mean_abs"] > 0).all()


def test_kill_and_resume_gives_the_same_metrics_as_an_uninterrupted_run(tiny_model_dir, tmp_path):
    sets = ("train.steps=6", "train.ckpt_every=2")
    ref = tmp_path / "ref"
    p = run(train_cmd(tiny_model_dir, ref, "stale", "is_center", *sets))
    assert p.returncode == 0, p.stderr[-3000:]
    sec = pd.read_parquet(ref / "metrics.parquet").set_index("step")["sec_checkpoint"]
    assert (sec[[2, 4]] > 0).all() and (sec[[1, 3, 5, 6]] == 0).all()  # no checkpoint after the last step

    out = tmp_path / "killed"
    proc = subprocess.Popen(train_cmd(tiny_model_dir, out, "stale", "is_center", *sets), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=own_process_env())
    wait_for("the run's first checkpoint", (out / "checkpoint.pt").exists, 300, proc, poll=0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists() and not (out / "metrics.parquet").exists()

    p = run(train_cmd(tiny_model_dir, out, "stale", "is_center", *sets))
    assert p.returncode == 0, p.stderr[-3000:]
    resumed_at = int(re.search(r"resuming .* from step (\d+)", (out / "train.log").read_text()).group(1))
    a, b = (pd.read_parquet(d / "metrics.parquet") for d in (ref, out))
    cols = [c for c in a.columns if not c.startswith("sec_")]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    # the checkpoint resumed from was written before its own time was known
    assert b.loc[b["sec_checkpoint"].isna(), "step"].tolist() == [resumed_at]
    # its summary times the steps after it, what the calibrated plan divides by (cluster/calibrate.py)
    summaries = [json.loads((d / "summary.json").read_text()) for d in (ref, out)]
    assert [s["steps_timed"] for s in summaries] == [6, 6 - resumed_at]


def test_a_tracking_change_resumes_and_keeps_a_finished_cell_and_a_learning_rate_change_does_neither(tiny_model_dir, tmp_path):
    """What a cell's numbers depend on (stamped.cell_identity) decides both a resume and whether a
    cell is finished: where it is watched does not, its learning rate does."""
    out = tmp_path / "cell"
    watched = ("tracking.backends=[tensorboard]", f"tracking.tensorboard_dir={tmp_path / 'tb'}")
    cmd = lambda *sets: train_cmd(tiny_model_dir, out, "stale", "pg", *sets) + ["--keep-checkpoint"]  # noqa: E731
    p = run(cmd())
    assert p.returncode == 0, p.stderr[-3000:]
    table, log = (out / "metrics.parquet").read_bytes(), (out / "train.log").read_text()
    ref = pd.read_parquet(out / "metrics.parquet")
    assert "starting" in log and (out / "checkpoint.pt").exists()  # the final state, kept

    p = run(cmd(*watched))  # finished: kept as it is, nothing trained
    assert p.returncode == 0, p.stderr[-3000:]
    assert (out / "metrics.parquet").read_bytes() == table and (out / "train.log").read_text() == log
    p = run(cmd("train.lr=0.15"))  # finished under other numbers: refused, never overwritten
    assert p.returncode == 2, p.stderr
    assert "holds a finished run of other numbers (config.train.lr: 0.3 there, 0.15 here)" in p.stderr, p.stderr
    assert (out / "metrics.parquet").read_bytes() == table

    def without_outputs():  # what Snakemake leaves of a job that failed after its last write
        for f in ("metrics.parquet", "summary.json"):
            (out / f).unlink()

    def since(text):
        return (out / "train.log").read_text().removeprefix(text)

    cols = [c for c in ref.columns if not c.startswith("sec_")]
    without_outputs()
    p = run(cmd(*watched))  # written again from the finished record: not one step recomputed
    assert p.returncode == 0, p.stderr[-3000:]
    assert "written again from finished.pt, no step recomputed" in since(log) and "resuming" not in since(log)
    assert (out / "metrics.parquet").read_bytes() == table
    without_outputs()
    (out / "finished.pt").unlink()  # a job stopped after its last checkpoint, before its record
    log = (out / "train.log").read_text()
    p = run(cmd(*watched))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming" in since(log)
    pd.testing.assert_frame_equal(ref[cols], pd.read_parquet(out / "metrics.parquet")[cols])
    without_outputs()
    p = run(cmd("train.lr=0.15"))  # neither the record nor the checkpoint is this run's
    assert p.returncode == 0, p.stderr[-3000:]
    assert "finished.pt is of another run (run.config.train.lr: 0.3 there, 0.15 here): removed" in p.stderr, p.stderr
    assert "is of another run (config.train.lr: 0.3 there, 0.15 here)" in p.stderr and "again from step 0" in p.stderr, p.stderr


def test_forced_threshold_resyncs_and_no_update_uses_a_batch_below_it(tiny_model_dir, tmp_path):
    out = tmp_path / "resync"
    p = run(train_cmd(tiny_model_dir, out, "stale", "is_resync", "train.resync_ess=0.9999", "train.steps=6"))
    assert p.returncode == 0, p.stderr[-3000:]
    df = pd.read_parquet(out / "metrics.parquet")
    summary = json.loads((out / "summary.json").read_text())
    resynced = df.loc[df.resync == 1]
    assert len(resynced) >= 1, "a stale sampler with a 0.9999 threshold must resync once the policy moves"
    assert summary["resync_steps"] == resynced["step"].tolist()
    assert (resynced["ess_lag_presync"] < 0.9999).all()  # the fresh batch was below the threshold
    assert (resynced["sync_version"] == resynced["step"] - 1).all()  # the sampler now holds θ_t
    assert (df["ess_lag"] >= 0.9999).all()  # no update used a batch below it
    assert df.loc[df.resync == 0, "ess_lag_presync"].isna().all()


def test_unknown_sampler_is_a_clear_error(tiny_model_dir, tmp_path):
    p = run(train_cmd(tiny_model_dir, tmp_path / "x", "fp4", "dlc"))
    assert p.returncode == 2 and "unknown sampler 'fp4'" in p.stderr
    assert not (tmp_path / "x").exists()


def test_micro_batched_step_gives_the_full_batch_numbers(tiny_model_dir, smoke_cfg):
    """Chunking a batch into micro-batches (the GPU memory plan) changes no number: log-probs,
    sampler KL, the correction's direction (stale sampler, θ_s ≠ θ_t) and the probe gradient; and
    a rejection that averages over its kept tokens (seq_mis, here dropping about half the
    sequences) and a mean over sequences (gspo) give the gradient of their own loss on the whole
    batch."""
    import dataclasses

    import torch

    from dlcrepro.step.corrections import TokenTerms, get_correction
    from dlcrepro.step.learner import flat_grad
    from dlcrepro.step.train import Cell, PhaseTimer, Trainer

    tr = Trainer(smoke_cfg, "tiny", "stale", "dlc", 0, tiny_model_dir)
    cell = Cell()
    tr.start_engines(cell)
    tr.step(cell, PhaseTimer())  # a real step first (engines warm, θ_s held apart)
    with torch.no_grad():  # and θ_t surely away from θ_s (a smoke step may have all-equal rewards)
        gen = torch.Generator().manual_seed(0)
        for p in tr.params:
            p.add_(1e-2 * torch.randn(p.shape, generator=gen))
    idx, prompts = tr.prompts_for(2)
    rollout = tr.engine.generate(prompts, 4, seed=11, topk=smoke_cfg.engine.topk)
    s = tr.score(rollout, idx)
    assert s.tb.num_seqs == 16 and len(s.tb.chunks(5)) == 4
    e = rollout.engine_logp
    # seq_mis's band (on π_engine/π_train, verl's orientation) cut at the batch's median: some
    # sequences dropped, some kept
    log_rho = torch.zeros(s.tb.num_seqs).index_add_(0, s.tb.seq, tr.log_probs(s, synced=False)[0].b - e)
    tr.cparams = dataclasses.replace(tr.cparams, seq_mis_low=0.0, seq_mis_high=float((-log_rho).median().exp()) * (1 + 1e-6))
    results = {}
    for mb in (1024, 5):
        tr.tcfg.micro_batch = mb
        batch = tr.batch(rollout, s, synced=False)
        lp = batch.trainer_logp
        assert (batch.kept is None) == (mb == 5)
        g_dlc, diag_dlc = tr.correction_grad(batch)
        batch.release_sampler_distribution()  # the others recompute θ_t's logits and θ_s's distribution
        # a sequence-level correction too: each micro-batch holds whole sequences
        with tr.correcting_as("seq_mis"):
            g_seq, diag_seq = tr.correction_grad(batch)
        with tr.correcting_as("gspo"):
            g_gspo, _ = tr.correction_grad(batch)
        results[mb] = (lp.a, lp.b, lp.kl_sampler, g_dlc, g_seq, tr.pg_grad(s), tr.token_logp(tr.initial_model, s.tb),
                       g_gspo, *diag_dlc.values(), *diag_seq.values())
    full, chunked = results[1024], results[5]
    assert (full[0] - full[1]).abs().max() > 0  # the lag is real
    assert 0 < diag_seq["corr_masked_seq_share"] < 1
    # the kept-token mean's and the sequence mean's gradients, straight from the loss on the whole batch
    for name, i in (("seq_mis", 4), ("gspo", 7)):
        logits = tr.logits(tr.policy, s.tb)
        terms = TokenTerms(logits=logits, tokens=s.tb.tokens, adv=s.adv_tok, e=e, a=lp.a, old=lp.b, q=None,
                           logp_s_of=lambda: tr.sampler_logp(s.tb, False, None), seq=s.tb.seq, num_seqs=s.tb.num_seqs)
        reference = flat_grad(get_correction(name).fn(terms, tr.cparams).loss, tr.params)
        for g in (full[i], chunked[i]):
            assert torch.allclose(g, reference, rtol=1e-4, atol=1e-6), (name, (g - reference).abs().max())
    for x, y in zip(full, chunked):
        if isinstance(x, float):
            assert abs(x - y) < 1e-6 * max(1.0, abs(x))
        else:
            assert torch.allclose(x, y, rtol=1e-4, atol=1e-6), (x - y).abs().max()


def test_success_metrics_of_a_batch_by_hand():
    import torch

    from dlcrepro.step.diagnostics import success_metrics

    # prompt 0: +1, -1 (mixed); prompt 1: -1, -1; prompt 2: +1, +1
    rewards = torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, 1.0])
    group = torch.tensor([0, 0, 1, 1, 2, 2])
    m = success_metrics(rewards, group, 3)
    assert m == pytest.approx({"pass_at_1": 0.5, "pass_at_k": 2 / 3, "mixed_groups": 1 / 3})


def test_gradient_snr_is_signal_over_the_variance_of_the_mean():
    import torch

    from dlcrepro.step.diagnostics import gradient_snr

    g1, g2 = torch.tensor([3.0, 0.0]), torch.tensor([1.0, 0.0])  # mean (2, 0): signal 4; noise |g1-g2|^2/4 = 1
    assert gradient_snr(g1, g2) == pytest.approx({"grad_signal": 4.0, "grad_snr": 4.0})
    assert gradient_snr(g1, g1.clone())["grad_snr"] != gradient_snr(g1, g1.clone())["grad_snr"]  # no noise: NaN


def test_a_non_finite_metric_stops_the_run_naming_step_and_column():
    from dlcrepro.step.divergence import NonFiniteError, check_finite

    check_finite(3, {"reward_mean": -0.5, "dev": float("nan"), "test_accuracy": float("nan")})  # NaN by definition off-probe
    with pytest.raises(NonFiniteError, match=r"step 3: ess_lag is nan"):
        check_finite(3, {"reward_mean": -0.5, "ess_lag": float("nan")})


def test_a_non_finite_update_is_a_divergence_after_theta_moved_and_a_fault_at_theta_0():
    import torch

    from dlcrepro.step.divergence import Diverged, NonFiniteError, check_direction_finite, check_weights_finite

    check_direction_finite(1, torch.ones(5))
    with pytest.raises(NonFiniteError, match=r"step 1: the update direction is inf at θ_0, before any update") as e:
        check_direction_finite(1, torch.tensor([0.0, float("inf")]))
    assert not isinstance(e.value, Diverged)  # at θ_0 a NaN is a fault: the run stops with an error
    with pytest.raises(Diverged, match=r"step 7: the update direction is nan: the run diverged") as e:
        check_direction_finite(7, torch.tensor([float("nan"), 1.0]))
    assert e.value.step == 7
    weights = [torch.ones(3, 2), torch.zeros(4)]
    check_weights_finite(9, weights, 4)
    for bad in (float("nan"), float("inf"), -float("inf")):
        weights[1][2] = bad
        with pytest.raises(Diverged,
                           match=r"step 9: the policy's weights are not finite after its update \(4 SGD step\(s\)\): the run "
                                 r"diverged") as e:
            check_weights_finite(9, weights, 4)
        assert e.value.step == 9


def test_a_run_that_diverges_ends_as_a_recorded_outcome_the_tables_name(tiny_model_dir, tmp_path):
    """A learning rate near float32's largest value overflows θ within the smoke config's 4 steps:
    the cell finishes (exit 0, the workflow goes on) with its rows before the divergence, the step
    it diverged at, and final accuracy 0; the accuracy and zoo tables name the run."""
    from dlcrepro.report import analysis, tables

    out = tmp_path / "tiny" / "stale" / "pg" / "seed0"
    p = run(train_cmd(tiny_model_dir, out, "stale", "pg", "train.lr=3.0e+38"))
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    at = s["diverged_at_step"]
    assert at is not None and 1 <= at <= 4, s
    df = pd.read_parquet(out / "metrics.parquet")
    assert s["steps"] == at - 1 == len(df) and list(df["step"]) == list(range(1, at))
    assert s["final_test_accuracy"] == 0.0
    assert f"step {at}: " in (out / "train.log").read_text() and "the run diverged" in p.stderr
    assert not (out / "checkpoint.pt").exists()
    steps, runs = analysis.collect([out / "summary.json"])
    assert runs["diverged_at_step"].tolist() == [at] and runs["final_test_accuracy"].tolist() == [0.0]
    t = tables.write_all(steps, runs, tmp_path / "tables", n_boot=20)
    mark = tables.DIVERGED_MARK  # a diverged run is marked with its step wherever it appears (#43)
    assert t["zoo"]["diverged"].tolist() == [f"{mark} 1 of 1: seed 0 at step {at}"]
    assert t["accuracy"]["final per seed"].tolist() == [f"0 ({mark} diverged at step {at})"]


def test_shared_rollouts_give_a_lagged_cell_the_numbers_it_samples_itself(tiny_model_dir, tmp_path):
    """A lagged sampler's cells read their θ_0 batches from one file (`rollouts`, the workflow's rule)
    and compute exactly what they compute sampling them; here a correction that reads the engine's
    distribution and resyncs (forced), after which its own engine samples. (The study's cells of
    every correction, with and without the file: docs/measurements.md.)"""
    shared = tmp_path / "stale.pt"
    p = run([sys.executable, "-m", "dlcrepro", "rollouts", "--config", str(SMOKE), "--model-dir", str(tiny_model_dir),
             "--sampler", "stale", "--seed", "0", "--topk", "64", "--out", str(shared)])
    assert p.returncode == 0, p.stderr[-3000:]
    sets = ("train.resync_ess=0.9999",)
    own, read = tmp_path / "own", tmp_path / "read"
    p = run(train_cmd(tiny_model_dir, own, "stale", "dlc", *sets))
    assert p.returncode == 0, p.stderr[-3000:]
    p = run(train_cmd(tiny_model_dir, read, "stale", "dlc", *sets) + ["--rollouts", str(shared)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"read from {shared}" in (read / "train.log").read_text()
    a, b = (pd.read_parquet(d / "metrics.parquet") for d in (own, read))
    cols = [c for c in a.columns if not c.startswith("sec_")]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert b["resync"].sum() >= 1  # the steps after the resync were sampled by the cell's engine
    # another run's file is refused before anything is trained, naming what differs
    p = run(train_cmd(tiny_model_dir, tmp_path / "other", "stale", "is",
                      "train.responses_per_prompt=2") + ["--rollouts", str(shared)])
    assert p.returncode == 2 and "holds rollouts of another run: train differ" in p.stderr
    assert not (tmp_path / "other" / "metrics.parquet").exists()


def test_a_seeds_initial_eval_gives_a_cell_the_accuracies_it_measures_itself(tiny_model_dir, tmp_path):
    """θ_0's evaluation, computed once per seed (`initial-eval`, the workflow's rule) with a `bf16`
    run's one engine, is what a cell whose probe engine is its second (`fp8`) measures itself: the
    same θ_0 accuracies and the same metrics after. (The study's cells, with and without the file:
    docs/measurements.md.)"""
    initial = tmp_path / "seed0.json"
    p = run([sys.executable, "-m", "dlcrepro", "initial-eval", "--config", str(SMOKE), "--model-dir", str(tiny_model_dir),
             "--seed", "0", "--out", str(initial)])
    assert p.returncode == 0, p.stderr[-3000:]
    own, read = tmp_path / "own", tmp_path / "read"
    p = run(train_cmd(tiny_model_dir, own, "fp8", "pg"))
    assert p.returncode == 0, p.stderr[-3000:]
    p = run(train_cmd(tiny_model_dir, read, "fp8", "pg") + ["--initial", str(initial)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"θ_0's accuracies are read from {initial}" in (read / "train.log").read_text()
    a, b = (json.loads((d / "summary.json").read_text()) for d in (own, read))
    assert b["initial_accuracies"] == a["initial_accuracies"] == json.loads(initial.read_text())["accuracies"]
    assert set(a["initial_accuracies"]) == {"accuracy_greedy", "accuracy_sampled", "heldout_accuracy_greedy", "test_accuracy"}
    m_own, m_read = (pd.read_parquet(d / "metrics.parquet") for d in (own, read))
    cols = [c for c in m_own.columns if not c.startswith("sec_")]
    pd.testing.assert_frame_equal(m_own[cols], m_read[cols])
    # another seed's file is refused before anything is trained, naming what differs
    other = train_cmd(tiny_model_dir, tmp_path / "other", "fp8", "pg")
    other[other.index("--seed") + 1] = "1"
    p = run(other + ["--initial", str(initial)])
    assert p.returncode == 2 and "holds θ_0's evaluation of another run: seed differ" in p.stderr
    assert not (tmp_path / "other" / "metrics.parquet").exists()


def test_a_damaged_initial_eval_file_is_named(tmp_path, smoke_cfg):
    from dlcrepro.study import initial_eval
    from dlcrepro.core.util import DamagedFileError

    path = tmp_path / "seed0.json"
    path.write_text('{"identity": {"seed": 0}, "accura')  # a write cut short
    with pytest.raises(DamagedFileError, match="seed0.json: not a readable θ_0 evaluation"):
        initial_eval.load_initial_eval(path, initial_eval.identity(smoke_cfg, "tiny", 0, small_model_dir(tmp_path / "m")))


def test_a_rollouts_file_without_the_top_k_a_correction_reads_is_refused(tmp_path, smoke_cfg):
    import torch

    from dlcrepro.study import rollouts
    from dlcrepro.core.config import ConfigError
    from dlcrepro.step.engine import Rollout

    one = Rollout(prompt_ids=[[1, 2]], response_ids=[[3]], group=torch.zeros(1, dtype=torch.long),
                  engine_logp=torch.zeros(1), topk_ids=None, topk_logp=None, version=0)
    ident = rollouts.identity(smoke_cfg, "tiny", "stale", 0, small_model_dir(tmp_path / "m"), 0)
    rollouts.save(tmp_path / "r.pt", ident, {1: one})
    assert rollouts.load(tmp_path / "r.pt", ident, 0)[1].response_ids == [[3]]
    with pytest.raises(ConfigError, match="top-0 log-probs, and this cell's correction reads the top-64"):
        rollouts.load(tmp_path / "r.pt", {**ident, "topk": 64}, 64)
    with pytest.raises(ConfigError, match="seed differ"):
        rollouts.load(tmp_path / "r.pt", {**ident, "seed": 1}, 0)
