"""The cluster user's path: the plan before anything runs (cells, GPU-hours, the largest job, what
is missing from the local cache), a dry run that stops on a missing model, and a job that refuses
to train a GPU config on a CPU torch."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import yaml

from conftest import PAPER_MODELS, QWEN3_CONFIGS, ROOT, SMOKE, cache_repo, fake_hf_cache
from dlcrepro import cluster
from dlcrepro.core.config import load

PAPER = ROOT / "configs" / "paper.yaml"


def run(cmd, hub, timeout=300):
    """`cmd` with the Hugging Face cache at `hub`; stdout and stderr as one stream, in the order written."""
    env = {**os.environ, "HF_HUB_CACHE": str(hub)}
    return subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env)


def plan(hub, *configs):
    return run([sys.executable, "-m", "dlcrepro", "plan", "--config", *map(str, configs)], hub)


def snakemake_dry_run(hub, configfile):
    return run([sys.executable, "-m", "snakemake", "--nolock", "-n", "--quiet", "rules", "--configfile", str(configfile)], hub)


# ----------------------------------------------------------------------------- the plan


def test_plan_of_the_paper_grid_counts_cells_gpu_hours_and_the_largest_job(tmp_path):
    p = plan(fake_hf_cache(tmp_path / "hub"), PAPER)
    assert p.returncode == 0, p.stdout
    out = p.stdout
    assert "168 cells: 144 trained, 24 copied" in out, out
    rows = {m: line.split() for line in out.splitlines() for m in ("qwen3-0.6b", "qwen3-1.7b", "total") if line.startswith(m)}
    # cells, trained, copied, done; GPU-hours requested (Σ runtime × GPUs: copies ask for none) and
    # estimated by the cost model (52.8 and 83.4 minutes per trained job, 73.8 and 117.4 per ppo_multi job:
    # test_cost_model_minutes_per_paper_job),
    # the 12 shared-rollouts jobs, 2 lagged samplers x 3 seeds per model (test_shared_rollouts_in_the_plan),
    # and the 6 θ_0 evaluations, one per model and seed (test_initial_evaluations_in_the_plan)
    assert rows["qwen3-0.6b"][1:5] == ["84", "72", "12", "0"] and "134.5" in rows["qwen3-0.6b"] and "(53-74 min/job)" in p.stdout
    assert rows["qwen3-1.7b"][1:5] == ["84", "72", "12", "0"] and "208.0" in rows["qwen3-1.7b"] and "(83-117 min/job)" in p.stdout
    assert rows["total"][1:] == ["168", "144", "24", "342.5", "169.7"]
    assert "shared rollouts: 12 job(s) first" in out and "θ_0 evaluations: 6 job(s) first" in out
    assert "largest single job: train qwen3-1.7b/" in out and "1 GPU, 170 min, 96000 MB, 8 CPUs" in out
    assert out.count(": ok (") == 3 and "MISSING" not in out


def test_plan_names_each_missing_item_with_its_download_line(tmp_path):
    hub = fake_hf_cache(tmp_path / "hub", models=PAPER_MODELS[:1], datasets=())
    p = plan(hub, PAPER)
    assert p.returncode == 1, p.stdout
    missing = [line for line in p.stdout.splitlines() if "MISSING" in line]
    assert len(missing) == 2, p.stdout
    assert "models.qwen3-1.7b.path=Qwen/Qwen3-1.7B" in missing[0] and missing[0].endswith("huggingface-cli download "
                                                                                          "Qwen/Qwen3-1.7B")
    assert missing[1].endswith("huggingface-cli download --repo-type dataset Jiayi-Pan/Countdown-Tasks-3to4")
    assert "models.qwen3-0.6b.path=Qwen/Qwen3-0.6B: ok" in p.stdout


SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
WEIGHT_MAP = {"embed.weight": SHARDS[0], "lm_head.weight": SHARDS[1], "norm.weight": SHARDS[1]}
INDEX = json.dumps({"metadata": {}, "weight_map": WEIGHT_MAP})


def two_shard_snapshot(hub, repo="Qwen/Qwen3-1.7B"):
    """A sharded checkpoint in the cache, both shards arrived."""
    files = {"config.json": b"{}", "model.safetensors.index.json": INDEX.encode(), SHARDS[0]: b"", SHARDS[1]: b""}
    return cache_repo(hub, f"models--{repo.replace('/', '--')}", files)


def test_a_two_shard_checkpoint_is_complete_with_both_shards_and_not_with_one(tmp_path):
    snap = two_shard_snapshot(tmp_path)
    assert cluster.checkpoint_problem(snap) == ""
    os.unlink(os.path.realpath(snap / SHARDS[1]))  # its blob gone: the link dangles
    problem = cluster.checkpoint_problem(snap)
    assert f"incomplete download at {snap}: missing 1 of 2 shards of model.safetensors.index.json ({SHARDS[1]})" in problem


def test_the_plan_names_an_interrupted_download_its_missing_shard_and_the_line_that_resumes_it(tmp_path):
    hub = fake_hf_cache(tmp_path / "hub", models=PAPER_MODELS[:1])
    snap = two_shard_snapshot(hub)
    (snap / SHARDS[1]).unlink()  # the second shard's download stopped: no link, its blob partial
    (snap.parents[1] / "blobs" / f"{'a' * 64}.incomplete").write_bytes(b"half")
    p = plan(hub, PAPER)
    assert p.returncode == 1, p.stdout
    line = next(line for line in p.stdout.splitlines() if line.startswith("  models.qwen3-1.7b.path"))
    assert f"MISSING: incomplete download at {snap}: missing 1 of 2 shards of model.safetensors.index.json ({SHARDS[1]})" in line
    assert "blobs/ holds 1 partial file(s) (*.incomplete)" in line
    assert line.endswith("fix: huggingface-cli download Qwen/Qwen3-1.7B")


def test_a_snapshot_without_weights_counts_as_missing(tmp_path):
    hub = fake_hf_cache(tmp_path / "hub")
    for f in hub.glob("models--Qwen--Qwen3-0.6B/snapshots/*/model.safetensors"):
        f.unlink()  # an interrupted download: config.json only
    p = plan(hub, PAPER)
    assert p.returncode == 1 and "incomplete download" in p.stdout and "missing the weights (model.safetensors" in p.stdout
    assert "huggingface-cli download Qwen/Qwen3-0.6B" in p.stdout


def test_tiny_configs_need_nothing_from_the_cache(tmp_path):
    p = plan(tmp_path / "empty-hub", ROOT / "configs" / "tiny.yaml", ROOT / "configs" / "replicate.yaml")
    assert p.returncode == 0, p.stdout
    # seeds 0-5: 72 trained (ppo_multi among them) and 12 copies per replicate
    assert "168 cells: 144 trained, 24 copied" in p.stdout
    assert "models.tiny: built here by the warm start" in p.stdout and "MISSING" not in p.stdout


def test_cost_model_minutes_per_paper_job():
    """By hand, seconds: 40 steps × (trainer share + 3 engine batches of 512 × 300 tokens + syncs)
    + 4 evaluations (steps 10..40; θ_0's is its seed's job's) × 1,024 × (1 greedy + 8 sampled)
    answers × 300 tokens + 180 engine start. 0.6B: 40 × (34.8 + 23.04 + 3) + 4 × 9216 × 300 / 20000
    + 180 = 3166.56; 1.7B: 40 × (53.2 + 38.4 + 6) + 4 × 9216 × 300 / 12000 + 180 = 5005.6. A ppo_multi
    job takes 3 more correction gradients a step: 40 × 3 × 10.5 = 1260 s more (0.6B), 40 × 3 × 17 = 2040 (1.7B)."""
    cfg = cluster.load_merged([str(PAPER)])
    assert cluster.estimated_minutes(cfg, "qwen3-0.6b") == pytest.approx(3166.56 / 60)
    assert cluster.estimated_minutes(cfg, "qwen3-1.7b") == pytest.approx(5005.6 / 60)
    assert cluster.estimated_minutes(cfg, "qwen3-0.6b", "pg") == pytest.approx(3166.56 / 60)
    assert cluster.estimated_minutes(cfg, "qwen3-0.6b", "ppo_multi") == pytest.approx((3166.56 + 1260) / 60)
    assert cluster.estimated_minutes(cfg, "qwen3-1.7b", "ppo_multi") == pytest.approx((5005.6 + 2040) / 60)
    assert cluster.estimated_minutes(load(SMOKE), "tiny") is None  # a CPU model: not in the GPU cost model


def test_the_plan_states_what_a_failure_can_cost_from_the_checkpoint_interval_and_the_profiles_retries():
    """By hand, minutes: a failure loses at most one checkpoint interval (5 of 40 steps) at the cell's
    mean step and the engines' start (3): 0.6B (52.776 - 3) / 40 x 5 + 3 = 9.222, a ppo_multi cell
    (73.776 - 3) / 40 x 5 + 3 = 11.847; without checkpoints, the whole job. The profile retries twice."""
    cfg = cluster.load_merged([str(PAPER)])
    assert cluster.failure_minutes(cfg, "qwen3-0.6b", "pg") == pytest.approx((52.776 - 3) / 40 * 5 + 3)
    assert cluster.failure_minutes(cfg, "qwen3-0.6b", "ppo_multi") == pytest.approx((73.776 - 3) / 40 * 5 + 3)
    whole = cluster.load_merged([str(PAPER)], {"train.ckpt_every": 0})
    assert cluster.failure_minutes(whole, "qwen3-0.6b", "pg") == pytest.approx(cluster.estimated_minutes(whole, "qwen3-0.6b"))
    assert cluster.profile_retries() == yaml.safe_load(cluster.SLURM_PROFILE.read_text())["retries"] == 2
    text = "\n".join(cluster.failure_lines(cfg, cluster.grid_cells(cfg), 2, "slurm/config.yaml"))
    assert "slurm/config.yaml: 2 retries" in text
    assert "qwen3-0.6b (a checkpoint every 5 of 40 steps): ≤ 9.2-11.8 GPU-min a failure, ≤ 23.7 a job failing 2 times" in text
    # 2 x (60 x 9.222 + 12 x 11.847) / 60 = 23.2 GPU-hours if every 0.6B job failed twice
    assert "≤ 23.2 GPU-h if every trained job did" in text
    assert cluster.failure_lines(load(SMOKE), cluster.grid_cells(load(SMOKE)), 2, "p") == []  # a CPU study


def test_shared_rollouts_in_the_plan():
    """By hand, minutes: a rollouts job generates 40 steps x 512 responses x 300 tokens (0.6B at 20,000
    tokens/s: 5.12; 1.7B at 12,000: 8.53) and starts one engine (1.5): 6.62 and 10.03, requested at
    twice that rounded up to 10 minutes (20, 30). Each of the 5 trained lagged cells per sampler and
    seed that never resync (pg, center, is, is_center, ppo_multi) no longer samples them:
    6 x (6.62 - 5 x 5.12) = -113.9 min for 0.6B and 6 x (10.03 - 5 x 8.53) = -195.8 for 1.7B, beside
    the 72 trained jobs' 60 x 52.78 + 12 x 73.78 and 60 x 83.43 + 12 x 117.43 minutes and 20 and 30
    minutes requested a job."""
    cfg = cluster.load_merged([str(PAPER)])
    assert len(cluster.rollouts_jobs(cfg)) == 12
    assert cluster.rollouts_minutes(cfg, "qwen3-0.6b", "stale") == pytest.approx(40 * 512 * 300 / 20000 / 60 + 1.5)
    assert cluster.job_resources(cfg, "qwen3-0.6b", "rollouts", "stale")["runtime"] == 20
    assert cluster.job_resources(cfg, "qwen3-1.7b", "rollouts", "fp8_stale")["runtime"] == 30
    assert cluster.rollouts_jobs(load(SMOKE)) == [("tiny", "stale", 0), ("tiny", "fp8_stale", 0)]


def test_initial_evaluations_in_the_plan():
    """By hand, minutes: a θ_0 evaluation job answers 1,024 problems × 9 times × 300 tokens (0.6B at
    20,000 tokens/s: 2.30; 1.7B at 12,000: 3.84) and starts one engine (1.5): 3.80 and 5.34, requested
    at twice that rounded up to 10 minutes (10, 20); one per model and seed. With the rollouts
    (test_shared_rollouts_in_the_plan): 0.6B 60 x 52.776 + 12 x 73.776 - 113.9 + 3 x 3.804 = 3949.4
    min = 65.8 h, requested 72 x 110 + 6 x 20 + 3 x 10 min = 134.5 h; 1.7B 60 x 83.427 + 12 x 117.427 -
    195.8 + 3 x 5.34 = 6234.9 min = 103.9 h, requested 72 x 170 + 6 x 30 + 3 x 20 min = 208.0 h (the plan test)."""
    cfg = cluster.load_merged([str(PAPER)])
    assert cluster.initial_eval_jobs(cfg) == [(m, s) for m in ("qwen3-0.6b", "qwen3-1.7b") for s in (0, 1, 2)]
    assert cluster.initial_eval_minutes(cfg, "qwen3-0.6b") == pytest.approx(9216 * 300 / 20000 / 60 + 1.5)
    assert cluster.job_resources(cfg, "qwen3-0.6b", "initial_eval")["runtime"] == 10
    assert cluster.job_resources(cfg, "qwen3-1.7b", "initial_eval")["runtime"] == 20
    assert cluster.initial_eval_jobs(load(SMOKE)) == [("tiny", 0)]


@pytest.mark.parametrize("model", ["qwen3-0.6b", "qwen3-1.7b"])
def test_a_paper_jobs_runtime_request_is_twice_the_cost_models_estimate_rounded_up_to_10_minutes(model):
    cfg = cluster.load_merged([str(PAPER)])
    assert cluster.job_resources(cfg, model)["runtime"] == 10 * math.ceil(2 * cluster.estimated_minutes(cfg, model) / 10)


def test_one_job_resources_function_by_job_kind():
    """Every job's Slurm request comes from cluster.job_resources: a training job's from the config,
    a copy's COPY_RESOURCES, a rollouts or θ_0 job's a training job's with the cost model's runtime,
    a scan's the config's with its own defaults on two cores; an unknown kind is an error."""
    cfg = cluster.load_merged([str(PAPER)])
    train = cluster.job_resources(cfg, "qwen3-0.6b")
    assert train == {"gpu": 1, "runtime": 110, "mem_mb": 64000, "cpus_per_task": 8}
    assert cluster.job_resources(cfg, "qwen3-0.6b", "copy") == cluster.COPY_RESOURCES
    assert cluster.job_resources(cfg, "qwen3-0.6b", "rollouts", "stale") == {**train, "runtime": 20}
    assert cluster.job_resources(cfg, "qwen3-0.6b", "initial_eval") == {**train, "runtime": 10}
    assert cluster.job_resources(cfg, "qwen3-0.6b", "scan") == {**train, "cpus_per_task": 2}
    tiny = load(SMOKE)  # no resources in the config: the defaults, and a CPU model's cost is not modelled
    assert cluster.job_resources(tiny, "tiny") == cluster.TRAIN_DEFAULTS
    assert cluster.job_resources(tiny, "tiny", "rollouts", "stale") == cluster.TRAIN_DEFAULTS
    assert cluster.job_resources(tiny, "tiny", "scan") == {"gpu": 0, "runtime": 60, "mem_mb": 4000, "cpus_per_task": 2}
    assert [cluster.gres(cluster.job_resources(c, m)) for c, m in ((cfg, "qwen3-0.6b"), (tiny, "tiny"))] == ["gpu:1", ""]
    with pytest.raises(ValueError, match="unknown job kind 'warm'"):
        cluster.job_resources(cfg, "qwen3-0.6b", "warm")


@pytest.fixture(scope="module")
def untrained_tiny(tmp_path_factory):
    """The smoke config's tiny model after one warm-start step: answers to count, not to score."""
    from dlcrepro.study.warmstart import warmstart

    out = tmp_path_factory.mktemp("tiny")
    warmstart(load(SMOKE, {"models.tiny.warmstart.steps": 1}), "tiny", out)
    return out / "model"


def eval_settings(path):
    """Each distinct evaluation of a shipped config's models: (eval_on, eval_mode, eval_samples, pool_size > 0)."""
    cfg = cluster.load_merged([str(path)])
    return {(t.eval_on, t.eval_mode, t.eval_samples, t.pool_size > 0) for t in map(cfg.train_for, cfg.grid.models)}


SHIPPED_EVALS = sorted(set().union(*(eval_settings(p) for p in sorted((ROOT / "configs").glob("*.yaml")))))


@pytest.mark.engine
@pytest.mark.parametrize("eval_on,eval_mode,eval_samples,pooled", SHIPPED_EVALS)
def test_the_cost_model_counts_the_answers_an_evaluation_generates(untrained_tiny, eval_on, eval_mode, eval_samples, pooled):
    """A real Trainer.evaluate, with each evaluation setting of configs/*.yaml on the tiny model
    (4 test problems, a pool of 3): the answers its engine returns are the formula's."""
    from dlcrepro.step.train import Trainer

    cfg = load(SMOKE, {"task.n_test": 4, "train.pool_size": 3 if pooled else 0, "train.eval_on": eval_on,
                       "train.eval_mode": eval_mode, "train.eval_samples": eval_samples})
    tr = Trainer(cfg, "tiny", "bf16", "pg", 0, untrained_tiny)
    engine, answers = tr.probe_engine, []

    def counted(method, responses):  # the engine's own call, its answers counted
        def call(*args, **kwargs):
            out = method(*args, **kwargs)
            answers.extend(responses(out))
            return out
        return call

    engine.greedy = counted(engine.greedy, lambda out: out)
    engine.generate = counted(engine.generate, lambda rollout: rollout.response_ids)
    tr.evaluate(0)
    assert len(answers) == cluster.eval_answers_per_eval(cfg, "tiny")
    assert len(answers) == (3 * (1 + eval_samples) + 4 if eval_on == "pool" else 4 * (1 + eval_samples))


def by_hand(arch: dict, dtype: str, T: int, R: int, correction: str, flat_gradients: int = 3) -> dict[str, float]:
    """The documented memory model (docs/cluster.md, "Memory and time model") written out from its
    coefficients, in GiB, for a micro-batch of T padded and R response tokens: counted weights and
    flat gradients (a fourth, θ before the SGD steps, where a correction takes several a batch),
    measured bytes per token."""
    h, i, L, V = arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"], arch["vocab_size"]
    heads, kv_heads, d = arch["num_attention_heads"], arch["num_key_value_heads"], arch["head_dim"]
    P, c = cluster.param_count(arch), cluster.LAYER_BYTES[dtype]
    layer = c["h"] * h + c["i"] * i + c["q"] * heads * d + c["kv"] * kv_heads * d
    layer += c["heads"] * heads + c["kv_heads"] * kv_heads + c["one"]
    outside = cluster.OUTSIDE_LAYERS_BYTES["h"] * h + cluster.OUTSIDE_LAYERS_BYTES["one"]
    per_response_token = cluster.LOGIT_BYTES[correction] * V + cluster.HEAD_INPUT_BYTES[dtype] * h
    gib = 2**30
    return dict(weights=P * (12 + 2 * (dtype == "bfloat16")) / gib, gradients=flat_gradients * 4 * P / gib,
                activations=T * (outside + L * layer) / gib, logits=R * per_response_token / gib)


def test_peak_memory_of_a_qwen3_0_6b_paper_job_from_its_config_json(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(fake_hf_cache(tmp_path / "hub", models=PAPER_MODELS[:1])))
    cfg = cluster.load_merged([str(PAPER)])
    snap = next((tmp_path / "hub").glob("models--Qwen--Qwen3-0.6B/snapshots/*"))
    arch = json.loads((snap / "config.json").read_text())
    mem = cluster.peak_memory(cfg, "qwen3-0.6b", arch)
    # tied embedding 151936·1024, 28 layers × (q, o 1024·2048 each, k, v 1024·1024 each, q/k norms
    # 2·128, MLP 3·1024·3072, two norms 2·1024), final norm 1024: Qwen3-0.6B's published 0.6 B
    layer = 2 * 1024 * 2048 + 2 * 1024 * 1024 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024
    assert mem.params == 151936 * 1024 + 28 * layer + 1024 == 596_049_920
    # 300-token responses: micro_batch 16 rows of 420 tokens (6,720 ≤ micro_batch_tokens 9,120); dlc, the
    # grid's largest logits per response token; ppo_multi's 4 SGD steps a batch, a fourth flat gradient;
    # the fp8 and stale samplers' jobs run two engines
    hand = by_hand(arch, "bfloat16", 16 * 420, 16 * 300, "dlc", flat_gradients=4)
    assert (mem.rows, mem.response_tokens) == (16, 300)
    assert {k: getattr(mem, k) for k in hand} == pytest.approx(hand)
    assert mem.engines == pytest.approx(2 * 0.12 * cluster.GPU_GIB)
    # the worst response length up to max_tokens 1024: 8 rows of 1,020 fill micro_batch_tokens 9,120 exactly
    worst = cluster.worst_peak_memory(cfg, "qwen3-0.6b", arch)
    assert (worst.rows, worst.response_tokens) == (8, 1020)
    assert worst.trainer == pytest.approx(sum(by_hand(arch, "bfloat16", 8 * 1140, 8 * 1020, "dlc", 4).values()))
    text = cluster.plan_text(cfg)
    assert "peak memory of a job (cluster.peak_memory" in text
    assert f"  qwen3-0.6b: 0.60 B params; trainer {mem.trainer:.1f} GiB" in text and f"= {mem.total:.1f} GiB" in text
    assert f"at worst {worst.total:.1f} GiB of the card's {cluster.GPU_GIB} (8 responses of 1020 tokens" in text
    assert "  qwen3-1.7b: not estimated (no complete checkpoint here to read config.json from)" in text


def test_the_model_gives_the_paper_step_counted_on_shape_only_tensors():
    """bench/memory_model.py paper: gpu_check's paper-trainer step (512 sequences, responses of
    150-450 tokens) on shape-only tensors at 28 layers counted 60.474 and 72.252 GiB (θ copies
    included), its largest dlc micro-batch 8,992 padded and 5,244 response tokens (Qwen3-0.6B), 4,488
    and 2,927 (Qwen3-1.7B). The model at those micro-batches: weights, three flat gradients, one
    micro-batch."""
    for repo, T, R, counted in (("Qwen/Qwen3-0.6B", 8992, 5244, 64_933_521_564),
                                ("Qwen/Qwen3-1.7B", 4488, 2927, 77_580_369_013)):
        model = sum(by_hand(QWEN3_CONFIGS[repo], "bfloat16", T, R, "dlc").values())
        assert model == pytest.approx(counted / 2**30, abs=0.01)


@pytest.mark.parametrize("repo", PAPER_MODELS)
def test_a_paper_job_fits_the_h200_at_its_worst_response_length(repo):
    cfg = cluster.load_merged([str(PAPER)])
    model = {"Qwen/Qwen3-0.6B": "qwen3-0.6b", "Qwen/Qwen3-1.7B": "qwen3-1.7b"}[repo]
    arch = QWEN3_CONFIGS[repo]
    worst = cluster.worst_peak_memory(cfg, model, arch)
    assert all(cluster.peak_memory(cfg, model, arch, r).total <= worst.total for r in (1, 150, 300, 450, 1024))
    assert worst.total < cluster.GPU_GIB, worst


def test_the_memory_table_of_docs_cluster_md_is_the_plans():
    """docs/cluster.md, "Memory and time model": each paper job's predicted peak, by part, as
    cluster.peak_memory gives it at the row's response length (and that length the worst)."""
    cfg = cluster.load_merged([str(PAPER)])
    rows = [r for r in (ROOT / "docs" / "cluster.md").read_text().splitlines() if r.startswith("| Qwen3-")]
    assert len(rows) == 4, rows
    for row in rows:
        job, responses, micro, *gib = (c.strip() for c in row.strip("|").split("|"))
        model, arch = job.lower(), QWEN3_CONFIGS[f"Qwen/{job}"]
        r = int(responses.split()[0].replace(",", ""))
        mem = cluster.peak_memory(cfg, model, arch, r)
        assert micro == f"{mem.rows} × {cluster.PROMPT_TOKENS + r:,}", row
        parts = (mem.weights, mem.gradients, mem.activations, mem.logits, mem.trainer, mem.engines, mem.total)
        assert gib == [f"{x:.1f}" for x in parts], row
        if "worst" in responses:
            assert cluster.worst_peak_memory(cfg, model, arch).response_tokens == r


def test_config_files_merge_as_snakemakes_configfiles():
    cfg = cluster.load_merged([str(ROOT / "configs" / "tiny.yaml"), str(ROOT / "configs" / "replicate.yaml")], {"train.lr": 0.1})
    assert (cfg.grid.seeds == [0, 1, 2, 3, 4, 5] and cfg.train.lr == 0.1
            and cfg.train.steps == load(ROOT / "configs" / "tiny.yaml").train.steps)


# ----------------------------------------------------------------------------- the workflow


@pytest.mark.snakemake
def test_a_dry_run_with_a_missing_model_fails_before_any_job_with_the_fetch_line(tmp_path):
    hub = fake_hf_cache(tmp_path / "hub", models=PAPER_MODELS[:1])
    p = snakemake_dry_run(hub, PAPER)
    text = p.stdout
    assert p.returncode != 0, text[-3000:]
    assert "huggingface-cli download Qwen/Qwen3-1.7B" in text and "Nothing was submitted." in text, text[-3000:]
    assert "largest single job" in text  # the plan comes first
    assert "Job stats" not in text and "Building DAG" not in text  # stopped while parsing: no job exists


def finish(results, model):
    """Every trained cell of the paper grid's `model` as a finished run leaves it (its summary.json)."""
    for c in cluster.grid_cells(cluster.load_merged([str(PAPER)])):
        if c.model == model and c.same_as is None:
            (results / c.name).mkdir(parents=True)
            (results / c.name / "summary.json").write_text("{}")


@pytest.mark.snakemake
def test_a_dry_run_whose_cells_needing_a_missing_model_are_finished_goes_on(tmp_path):
    """Only a cell still to run loads a model: with Qwen3-1.7B's cells finished its weights may be
    gone (the plan says so); with one of them unfinished the dry run stops as before."""
    hub = fake_hf_cache(tmp_path / "hub", models=PAPER_MODELS[:1])
    results = tmp_path / "results"
    finish(results, "qwen3-1.7b")
    cmd = [sys.executable, "-m", "snakemake", "--nolock", "-n", "--quiet", "rules", "--configfile", str(PAPER),
           "--config", f"results_dir={results}"]
    p = run(cmd, hub)
    assert p.returncode == 0 and "Nothing was submitted." not in p.stdout, p.stdout[-3000:]
    assert "models.qwen3-1.7b.path=Qwen/Qwen3-1.7B: MISSING (no cell left to run reads it: its cells are finished)" in p.stdout
    next(results.glob("qwen3-1.7b/fp8/*/seed0/summary.json")).unlink()
    p = run(cmd, hub)
    assert p.returncode != 0 and "huggingface-cli download Qwen/Qwen3-1.7B" in p.stdout and "Nothing was submitted." in p.stdout


@pytest.mark.snakemake
def test_the_tables_of_a_finished_grid_need_no_weights_and_no_data(tmp_path):
    results = tmp_path / "results"
    for model in ("qwen3-0.6b", "qwen3-1.7b"):
        finish(results, model)
    cmd = [sys.executable, "-m", "snakemake", "tables", "--nolock", "-n", "--quiet", "rules", "--configfile", str(PAPER),
           "--config", f"results_dir={results}"]
    p = run(cmd, tmp_path / "empty-hub")
    assert p.returncode == 0 and p.stdout.count("MISSING (no cell left to run reads it") == 3, p.stdout[-3000:]


@pytest.mark.snakemake
def test_unlock_needs_no_weights(tmp_path):
    """`snakemake --unlock` loads no model: it works with the paper grid unfinished and its weights gone."""
    work = tmp_path / "work"
    (work / ".snakemake" / "locks").mkdir(parents=True)
    (work / ".snakemake" / "locks" / "0.input.lock").write_text("")  # what a killed run leaves
    cmd = [sys.executable, "-m", "snakemake", "--unlock", "--configfile", str(PAPER), "--directory", str(work)]
    p = run(cmd, tmp_path / "empty-hub")
    assert p.returncode == 0 and "Unlocked working directory." in p.stdout, p.stdout[-3000:]
    assert not list((work / ".snakemake").rglob("*.lock"))


@pytest.mark.snakemake
def test_a_dry_run_of_the_paper_grid_prints_the_plan_first(tmp_path):
    p = snakemake_dry_run(fake_hf_cache(tmp_path / "hub"), PAPER)
    text = p.stdout
    assert p.returncode == 0, text[-3000:]
    assert text.index("168 cells: 144 trained, 24 copied") < text.index("Job stats")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch has no CUDA device")
@pytest.mark.snakemake
def test_a_gpu_models_job_config_carries_its_gpu_count_so_the_job_can_refuse_a_cpu_torch(tmp_path):
    """Jobs read results/_config/<model>.yaml, which leaves Slurm resources out (editing them reruns
    nothing) except the GPU count: without it a job could not know it must not train on CPU."""
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "snakemake", "--nolock", "-n", "--quiet", "rules", "--configfile", str(PAPER), "--config",
           f"results_dir={results}"]
    p = run(cmd, fake_hf_cache(tmp_path / "hub"))
    assert p.returncode == 0, p.stdout[-3000:]
    job_cfg = load(results / "_config" / "qwen3-0.6b.yaml")
    assert job_cfg.models["qwen3-0.6b"].resources == {"gpu": 1}  # runtime, memory, cores stay out
    with pytest.raises(cluster.DeviceError, match="models.qwen3-0.6b.resources.gpu=1 asks for a GPU"):
        cluster.check_device(job_cfg, "qwen3-0.6b")


@pytest.mark.snakemake
def test_a_local_dry_run_of_the_smoke_grid_needs_no_cache_and_prints_no_plan(tmp_path):
    p = snakemake_dry_run(tmp_path / "empty-hub", SMOKE)
    assert p.returncode == 0, (p.stdout)[-3000:]
    assert "dlcrepro plan" not in p.stdout


# ----------------------------------------------------------------------------- the device check


def gpu_config(**gpu):
    cfg = load(SMOKE)
    cfg.models["tiny"].resources.update(gpu)
    return cfg


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch has no CUDA device")
def test_a_gpu_config_stops_before_anything_loads_naming_the_environment_and_the_fix(tmp_path, monkeypatch):
    from dlcrepro.study import celldir
    from dlcrepro.step import train

    def must_not_run(*a, **k):
        raise AssertionError("a model or engine was loaded before the device check")

    monkeypatch.setattr(celldir, "Trainer", must_not_run)
    monkeypatch.setattr(train, "load_model", must_not_run)
    mdir = tmp_path / "model"
    mdir.mkdir()
    (mdir / "config.json").write_text("{}")
    out = tmp_path / "cell"
    with pytest.raises(cluster.DeviceError) as e:
        celldir.run_cell(gpu_config(gpu=1), "tiny", "bf16", "pg", 0, out, model_dir=str(mdir))
    msg = str(e.value)
    assert "models.tiny.resources.gpu=1 asks for a GPU" in msg
    assert sys.executable in msg and f"torch {torch.__version__}" in msg
    assert "bash scripts/setup.sh --gpu" in msg and "models.tiny.resources.gpu: 0" in msg
    assert not out.exists()  # nothing written: the job failed at once


def test_a_cuda_torch_without_a_device_is_refused_too(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cfg = load(SMOKE, {"resources": {"gpu": 2}})  # the config-wide default applies to the model
    with pytest.raises(cluster.DeviceError, match=r"resources.gpu=2 asks for a GPU, but torch sees 0 CUDA device"):
        cluster.check_device(cfg, "tiny")


def test_a_cpu_config_passes_the_device_check():
    cluster.check_device(load(SMOKE), "tiny")
    cluster.check_device(gpu_config(gpu=0), "tiny")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch has no CUDA device")
def test_a_gpu_config_job_exits_at_once_with_the_error(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cmd = [sys.executable, "-m", "dlcrepro", "train", "--config", str(SMOKE), "--set", "models.tiny.resources.gpu=1",
           "--model-dir", str(tmp_path / "model"), "--sampler", "bf16", "--correction", "pg", "--seed", "0", "--out",
           str(tmp_path / "cell")]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "error: models.tiny.resources.gpu=1 asks for a GPU" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


def test_a_job_finds_an_hf_model_given_by_its_id(tmp_path, monkeypatch):
    """The workflow hands a paper job `--model-dir Qwen/Qwen3-0.6B` (the config's path): the job
    finds its snapshot in the local cache, and a model missing there is an error saying how to fetch it."""
    from dlcrepro.core.config import ConfigError
    from dlcrepro.study.celldir import cell_model_dir

    cfg = cluster.load_merged([str(PAPER)])
    monkeypatch.setenv("HF_HUB_CACHE", str(fake_hf_cache(tmp_path / "hub", models=PAPER_MODELS[:1], datasets=())))
    monkeypatch.chdir(tmp_path)  # no directory named like the id here
    model = next(m for m, c in cfg.models.items() if c.path == PAPER_MODELS[0])
    assert cell_model_dir(cfg, model, PAPER_MODELS[0]) == next((tmp_path / "hub").glob("models--*/snapshots/*"))
    other = next(m for m, c in cfg.models.items() if c.path == PAPER_MODELS[1])
    with pytest.raises(ConfigError, match=f"huggingface-cli download {PAPER_MODELS[1]}"):
        cell_model_dir(cfg, other, PAPER_MODELS[1])
