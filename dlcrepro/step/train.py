"""The training loop: a Trainer takes a cell's steps one at a time (`Trainer.step`), `train_steps`
takes them all.

Each step, top to bottom: sync (on the sampler's schedule) → sample → score → trainer log-probs at
θ_t and θ_s → resync check (and, where it fires, the batch again from θ_s = θ_t) → on-policy probes
→ correction → SGD update(s) → probe metrics (dev, floor) → eval; `train_steps` checkpoints every
`ckpt_every` steps. Every random draw is seeded from (seed, step, purpose) (seeds.py), so a resumed
run is identical to an uninterrupted one.

Beside it: the maths of a step in learner.py, the row's metrics in diagnostics.py, what ends a run
as diverged in divergence.py, and the cell's directory (config, resume, metrics, summary, log,
copies of twin cells) in celldir.py.
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import checkpoint, countdown, data
from ..core import tracking
from ..core.config import Config, ConfigError
from .diagnostics import EVAL_COLUMNS, BatchTerms, ProbeTerms, missing, step_metrics
from .divergence import Diverged, blown_up, check_direction_finite, check_finite, check_weights_finite, ended, largest_abs_weight
from .engine import Rollout, SyncCheckError, VLLMEngine
from ..core.grid import PROBE_PRECISION, get_sampler
from .learner import Batch, BatchLogProbs, Learner, Probes, Scored
from .model import load_model, load_tokenizer, make_token_batch
from ..core.phases import PHASES, Schedule
from ..core.procs import pause_point
from ..core.registry import engine_topk, updates_per_batch
from ..core.seeds import derive_seed, step_problems
from ..core.util import DamagedFileError, log


class PhaseTimer:
    """Wall seconds per phase of the current step."""

    def __init__(self):
        self.sec = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def __call__(self, phase: str):
        pause_point(phase)  # a test's kill at a known moment (procs.py); nothing otherwise
        t = time.perf_counter()
        # names the phase in a torch profile (bench/cell_profile.py); a few µs when none records
        with torch.profiler.record_function(f"phase:{phase}"):
            yield
        self.sec[phase] += time.perf_counter() - t


@dataclass
class Cell:
    """The state of one run that a checkpoint holds."""

    step: int = 0  # updates done
    sampler_version: int = 0  # version of θ_s (= number of updates it has)
    rows: list[dict] = field(default_factory=list)
    resync_steps: list[int] = field(default_factory=list)
    initial: dict = field(default_factory=dict)  # the accuracies of θ_0, measured before step 1
    diverged_at_step: int | None = None  # the first step a diverged run could not complete (docs/method.md#diverged-runs)


class Trainer(Learner):
    """A Learner with the run's engines and task: samples, scores and takes whole steps.

    `shared_rollouts` (step → batch, rollouts.py): the batches every cell of this sampler and seed
    samples at θ_0, which `sample` returns while the engine still holds θ_0. `initial` (initial_eval.py):
    θ_0's accuracies, which `evaluate(0)` returns. Without them the Trainer computes both itself:
    the same numbers."""

    def __init__(self, cfg: Config, model_name: str, sampler: str, correction: str, seed: int, model_dir: Path,
                 shared_rollouts: dict[int, Rollout] | None = None, initial: dict[str, float] | None = None):
        self.cfg, self.seed = cfg, seed
        self.sampler = get_sampler(sampler)
        mcfg = cfg.models[model_name]
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = load_tokenizer(model_dir)
        self.train_problems, self.test_problems = data.load_problems(cfg.task)
        super().__init__(load_model(model_dir), cfg.train_for(model_name), correction, mcfg.trainer_dtype, device)
        self.schedule = Schedule.of(self.tcfg)  # which steps probe, evaluate and checkpoint: the config's, fixed for the run
        # the problems RL draws its prompts from: a pool of the first `pool_size` (0: all)
        self.rl_problems = self.train_problems[: self.tcfg.pool_size or len(self.train_problems)]
        self._prompt_cache: dict[int, list[int]] = {}  # train prompts are encoded when first drawn
        self.test_prompts = data.encode_prompts(self.tokenizer, self.test_problems, cfg.task.prompt)
        # the problems test_accuracy is measured on: the held-out test set, or the RL pool itself
        if self.tcfg.eval_on == "pool":
            self.eval_problems = self.rl_problems
            self.eval_prompts = data.encode_prompts(self.tokenizer, self.eval_problems, cfg.task.prompt)
        else:
            self.eval_problems, self.eval_prompts = self.test_problems, self.test_prompts
        # engines take the model's own context length
        self.engine = VLLMEngine(str(model_dir), cfg.engine, self.sampler.precision, seed)
        # The on-policy probe/eval engine (grid.PROBE_PRECISION, synced to θ_t): the run's own where
        # the sampler is that engine (Sampler.is_probe_engine).
        self.probe_engine = (self.engine if self.sampler.is_probe_engine
                             else VLLMEngine(str(model_dir), cfg.engine, PROBE_PRECISION, seed))
        self.held: dict[str, int] = {}  # engine name (engine_name) -> the version this run last loaded into it
        self.sync_checks: list[dict] = []  # one per checked weight sync: engine, version, discrepancy, seconds
        # per engine name: the largest |weight| of the last version it matched; saved in the
        # checkpoint, so that a resumed run judges a failed check as an uninterrupted one does
        self.matched_weight_max: dict[str, float] = {}
        self.ckpt_on_disk: dict | None = None  # the sidecar entry of the checkpoint file on disk (checkpoint.save)
        self.topk = engine_topk(correction, cfg.engine)
        self.shared_rollouts = dict(shared_rollouts or {})
        self.initial_accuracies = None if initial is None else dict(initial)
        if self.correction.needs_q and self.topk < 1:
            raise ConfigError(f"engine.topk={self.topk}: correction {correction!r} reads the engine's next-token distribution; "
                              "it must be >= 1")

    # ------------------------------------------------------------------ the engines and the versions they hold

    def engine_of(self, role: str) -> VLLMEngine:
        """The engine playing `role`: "sampler" (θ_s) or "probe" (θ_t, BF16, for probes and evals)."""
        return self.engine if role == "sampler" else self.probe_engine

    def engine_name(self, role: str) -> str:
        """The name of the engine playing `role`, the same in every process: "sampler" for the run's
        engine (also the probe engine of the always-synced bf16 sampler), else "probe". The versions
        held and the growth baselines are kept by it, so one engine in two roles has one of each."""
        return "sampler" if self.engine_of(role) is self.engine else "probe"

    def holds(self, role: str, version: int) -> bool:
        """Whether the engine playing `role` holds `version` (this run loaded it there last)."""
        return self.held.get(self.engine_name(role)) == version

    def push_weights(self, role: str, model: torch.nn.Module, version: int, expected: torch.nn.Module | None = None) -> None:
        """`model`'s weights into the engine playing `role` as `version`, checked twice. First the
        load manifest (`engine.load_weights`): every tensor taken, every engine parameter reloaded,
        each engine tensor's fingerprint that of `expected`'s weights (the trainer's copy of that
        version; default `model`); a wrong load raises WeightLoadError and stops the run, always.
        Then the sync check (`engine.sync_check`): the engine draws a few short responses with the
        new weights (seeded apart from every training draw) and its log-probs of them are compared
        with `model`'s (`engine.check_sync`). A failed check raises SyncCheckError and stops the run, unless
        the weights blew up since the last version this engine matched (divergence.blown_up:
        Diverged, the run's outcome)."""
        engine, name = self.engine_of(role), self.engine_name(role)
        state = {k: v.detach() for k, v in model.state_dict().items()}
        want = None if expected is None else {k: v.detach() for k, v in expected.state_dict().items()}
        engine.load_weights(state, version, expected=want)  # WeightLoadError: a fault, never a divergence
        self.held[name] = version
        if not self.cfg.engine.sync_check:
            return
        top = largest_abs_weight(model.parameters())
        t = time.perf_counter()

        def trainer_logp(prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
            return self.token_logp(model, make_token_batch(prompts, responses, self.tokenizer.pad_token_id).to(self.device))

        try:
            d = engine.check_sync(trainer_logp, self.eval_prompts)
        except SyncCheckError as e:
            diverged = blown_up(version, top, self.matched_weight_max.get(name), engine.kind, e)
            if diverged is None:
                raise
            raise diverged from e
        if not math.isnan(d):  # a check that cannot tell (no likely token) matched nothing: the baseline stays
            self.matched_weight_max[name] = top
        sec = time.perf_counter() - t
        self.sync_checks.append({"engine": engine.kind, "version": version, "discrepancy": d, "seconds": sec})
        log(f"sync check: {engine.kind} engine holds version {version} (load manifest {1e3 * engine.manifest_seconds:.0f} ms): "
            f"mean |log q − log π| {d:.4f}/token (bound {engine.precision.sync_bound}) in {sec:.2f} s")

    def start_engines(self, cell: Cell, resumed: bool = False) -> None:
        """Give the run's engine θ_s (`cell.sampler_version`), checked, as a run does when it starts
        or resumes. Resumed: θ_s re-verified is no new match, so the growth baselines stay those the
        uninterrupted run had (the checkpoint's)."""
        baselines = dict(self.matched_weight_max)
        self.push_weights("sampler", self.sampler_model, cell.sampler_version)
        if resumed:
            self.matched_weight_max = baselines

    def sync_sampler(self, cell: Cell) -> None:
        """θ_s ← θ_t, pushed to the run's engine (unless it already holds this version of θ_t)."""
        version = cell.step
        self.sampler_model.load_state_dict(self.policy.state_dict())
        if not self.holds("sampler", version):
            self.push_weights("sampler", self.sampler_model, version, expected=self.policy)
        cell.sampler_version = version

    def sync_probe(self, version: int) -> None:
        """θ_t (as `version`) into the probe engine, unless it holds it."""
        if not self.holds("probe", version):
            self.push_weights("probe", self.policy, version)

    # ------------------------------------------------------------------ pieces of a step

    def prompts_for(self, step: int) -> tuple[list[int], list[list[int]]]:
        """The step's training problems (indices) and their prompt token ids."""
        idx = step_problems(self.seed, step, len(self.rl_problems), self.tcfg.prompts_per_step)
        new = [i for i in idx if i not in self._prompt_cache]
        for i, ids in zip(new, data.encode_prompts(self.tokenizer, [self.train_problems[i] for i in new], self.cfg.task.prompt)):
            self._prompt_cache[i] = ids
        return idx, [self._prompt_cache[i] for i in idx]

    def sample(self, k: int, cell: Cell, prompts: list[list[int]], purpose: str = "sample") -> Rollout:
        """Step k's batch from the run's engine, seeded by (seed, k, `purpose`): "sample", or
        "resample" after a resync. A first sample while the engine still holds θ_0 is the one every
        cell of this sampler and seed draws there: from the shared rollouts where the Trainer has them."""
        if purpose == "sample" and k in self.shared_rollouts and cell.sampler_version == 0 and self.holds("sampler", 0):
            return self.shared_rollout(k, prompts)
        return self.engine.generate(prompts, self.tcfg.responses_per_prompt, derive_seed(self.seed, k, purpose), self.topk)

    def shared_rollout(self, k: int, prompts: list[list[int]]) -> Rollout:
        """Step k's batch from the shared rollouts (rollouts.py), as the engine would return it."""
        r = self.shared_rollouts[k]
        if r.prompt_ids[:: self.tcfg.responses_per_prompt] != [list(p) for p in prompts]:
            raise DamagedFileError(f"the shared rollouts' step {k} has other prompts than this run draws there: "
                                   "the file is not this run's; delete it and rerun its rule")
        if not self.topk:  # the correction reads no engine distribution: as the engine returns without top-k
            r = dataclasses.replace(r, topk_ids=None, topk_logp=None)
        return r

    def score(self, rollout: Rollout, idx: list[int]) -> Scored:
        """The rollout with its responses' rewards and advantages (`idx`: its prompts' problems)."""
        problems = [self.train_problems[idx[g]] for g in rollout.group.tolist()]
        rewards = data.rewards(self.tokenizer, problems, rollout.response_ids)
        return Scored.of(rollout, rewards, len(idx), self.tokenizer.pad_token_id, self.device)

    def measure(self, rollout: Rollout, s: Scored, num_groups: int, synced: bool) -> Batch:
        """The trainer's log-probs of a scored batch of `num_groups` prompts and its batch metrics
        (diagnostics.step_metrics)."""
        batch = self.batch(rollout, s, synced)
        batch.metrics = step_metrics("batch", self.batch_terms(rollout, s, num_groups, batch.trainer_logp, batch.engine_logp))
        return batch

    def batch_terms(self, rollout: Rollout, s: Scored, num_groups: int, lp: BatchLogProbs, e: torch.Tensor) -> BatchTerms:
        return BatchTerms(rewards=s.rewards, group=rollout.group, num_groups=num_groups, lengths=rollout.lengths, e=e.cpu(),
                          a=lp.a.cpu(), b=lp.b.cpu(), seq=s.tb.seq.cpu(), num_seqs=s.tb.num_seqs, kl_sampler=lp.kl_sampler)

    def probe_terms(self, g_c: torch.Tensor, p: Probes) -> ProbeTerms:
        return ProbeTerms(g_c=g_c, g_on=p.g_on, g_on2=p.g_on2, logp_0=p.logp_0,
                          off_support_threshold=self.tcfg.off_support_threshold)

    def draw(self, k: int, cell: Cell, idx: list[int], prompts: list[list[int]], timer: PhaseTimer, purpose: str) -> Batch:
        """Sample, score and measure step k's batch (`purpose`: see `sample`)."""
        with timer("sample"):
            rollout = self.sample(k, cell, prompts, purpose)
        with timer("score"):
            s = self.score(rollout, idx)
        with timer("logprobs"):
            return self.measure(rollout, s, len(idx), synced=cell.sampler_version == cell.step)  # synced: θ_s is θ_t

    def probe_batches(self, k: int, cell: Cell, idx: list[int], prompts: list[list[int]]) -> Probes:
        """The step's on-policy probes: two batches of its prompts from the probe engine at θ_t (in
        one engine call, independent seeds, their tokens only) and their gradients (Learner.probe)."""
        self.sync_probe(cell.step)
        both = self.probe_engine.generate(prompts + prompts, self.tcfg.responses_per_prompt, derive_seed(self.seed, k, "probes"),
                                          logprobs=False)
        return self.probe([self.score(r, idx) for r in both.split(len(prompts))])

    # ------------------------------------------------------------------ one step

    def step(self, cell: Cell, timer: PhaseTimer) -> dict:
        """Take step `cell.step + 1` and return its metrics row (cell.step advances)."""
        k = cell.step + 1  # the step being taken, 1-based
        t = self.tcfg
        with timer("sync"):
            if k > 1 and self.sampler.due(k - 1, t.sync_every):
                self.sync_sampler(cell)
        idx, prompts = self.prompts_for(k)
        batch = self.draw(k, cell, idx, prompts, timer, "sample")
        ess_presync = math.nan
        with timer("resync"):
            resync = self.correction.resync and batch.metrics["ess_lag"] < t.resync_ess
            if resync:  # θ_s ← θ_t, and no update uses the batch below the threshold
                self.sync_sampler(cell)
                cell.resync_steps.append(k)
                ess_presync = batch.metrics["ess_lag"]
        if resync:  # the step's batch again, from the synced engine, with its own seeds
            batch = self.draw(k, cell, idx, prompts, timer, "resample")
        row = {"step": k, "sync_version": cell.sampler_version, "resync": int(resync), "ess_lag_presync": ess_presync,
               **batch.metrics}

        probing = self.schedule.probes(k)
        with timer("probe"):
            probes = self.probe_batches(k, cell, idx, prompts) if probing else None

        updates = updates_per_batch(self.correction.name, t)  # 1, or its own count, or train.updates_per_batch
        with timer("correction"):
            g_c, diagnostics = self.correction_grad(batch)  # spends the batch's kept logits
            row.update(diagnostics)
            check_finite(k, row)
            check_direction_finite(k, g_c)

        with timer("update"):
            # PPO's later epochs read the θ_s distribution the first pass read (the same numbers as θ_s's
            # forward again: measured, docs/measurements.md); the batch releases it after the last
            g_c = self.update(batch, g_c, updates=updates)
            # a diverged run (a later PPO epoch's gradient, or a step that overflows θ) ends here
            # (train_steps records it) instead of writing a row whose dev is NaN and going on
            check_weights_finite(k, self.params, updates)
        cell.step = k

        row.update(step_metrics("probe", self.probe_terms(g_c, probes)) if probing else missing("probe"))
        with timer("eval"):
            evaluating = self.schedule.evaluates(k)
            row.update(self.evaluate(k) if evaluating else dict.fromkeys(EVAL_COLUMNS, math.nan))
        check_finite(k, row)
        return row

    def evaluate(self, version: int) -> dict[str, float]:
        """The accuracies of θ_t (BF16 engine) on the eval problems, greedy and sampled
        (`eval_samples` answers each at temperature 1, seeded by the step), the held-out test set's
        greedy accuracy when the eval problems are the RL pool, and `test_accuracy`: the one
        `eval_mode` chooses for the tables. The plan's cost model counts these answers
        (`cluster.eval_answers_per_eval`). θ_0's (version 0) are the seed's evaluation
        (initial_eval.py) where the Trainer was given them; the probe engine gets θ_0, checked, either way."""
        t = self.tcfg
        self.sync_probe(version)
        if version == 0 and self.initial_accuracies is not None:
            return dict(self.initial_accuracies)
        greedy = self._correct(self.eval_problems, self.probe_engine.greedy(self.eval_prompts))
        sampled = self.probe_engine.generate(self.eval_prompts, t.eval_samples, derive_seed(self.seed, version, "eval"),
                                             logprobs=False)
        out = {
            "accuracy_greedy": float(np.mean(greedy)),
            "accuracy_sampled": float(np.mean(self._correct([self.eval_problems[g] for g in sampled.group.tolist()],
                                                            sampled.response_ids))),
            "heldout_accuracy_greedy": math.nan,
        }
        if t.eval_on == "pool":
            out["heldout_accuracy_greedy"] = float(np.mean(self._correct(self.test_problems,
                                                                         self.probe_engine.greedy(self.test_prompts))))
        out["test_accuracy"] = out[f"accuracy_{t.eval_mode}"]
        return out

    def _correct(self, problems, responses) -> list[bool]:
        return [r == countdown.REWARD_CORRECT for r in data.rewards(self.tokenizer, problems, responses)]

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: Path, cell: Cell, run: dict | None = None) -> None:
        """The run's state at `path`, with the sidecar that vouches for it (dlcrepro/checkpoint.py);
        `run`: the run it belongs to (`celldir.run_identity`), which a resume must match."""
        blob = {
            "cell": cell.__dict__,
            "policy": self.policy.state_dict(),
            "optimizer": self.opt.state_dict(),
            "sampler": self.sampler_model.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "matched_weight_max": dict(self.matched_weight_max),
            "run": run,
        }
        self.ckpt_on_disk = checkpoint.save(path, blob, run, cell.step, self.ckpt_on_disk)

    def load_checkpoint(self, path: Path, run: dict | None = None) -> Cell:
        """The state of a verified checkpoint (of `run`, if given); checkpoint.BadCheckpoint if it is not one."""
        blob, self.ckpt_on_disk = checkpoint.load(path, run, map_location=self.device)
        self.policy.load_state_dict(blob["policy"])
        self.opt.load_state_dict(blob["optimizer"])
        self.sampler_model.load_state_dict(blob["sampler"])
        torch.set_rng_state(blob["torch_rng"])
        self.matched_weight_max = dict(blob.get("matched_weight_max", {}))  # none in a checkpoint written before it was saved
        return Cell(**blob["cell"])


def train_steps(tr: Trainer, cell: Cell, *, ckpt: Path, run: dict, note, desc: str,
                trackers: tracking.Trackers) -> dict[str, float]:
    """Take the cell's remaining steps, one metrics row each, checkpointing every `ckpt_every`
    steps (not after the last) to `ckpt` as the run `run` (celldir.run_identity) and sending each
    finished row to the trackers; the seconds spent per phase, summed over these steps. A run that
    diverges ends there, its rows so far kept. `note` writes a line to the cell's log; `desc` labels
    the progress bar. Keyword-only after the cell: five arguments easy to pass in the wrong order."""
    totals = dict.fromkeys(PHASES, 0.0)
    steps, schedule = tr.tcfg.steps, tr.schedule
    bar = tqdm(total=steps, initial=cell.step, desc=desc, unit="step", mininterval=2.0)
    while cell.step < steps:
        timer = PhaseTimer()
        try:
            row = tr.step(cell, timer)
        except Diverged as e:  # the run's outcome, not a fault
            cell.diverged_at_step = ended(cell.rows)
            note(f"{e}; the run ends with its {len(cell.rows)} finished step(s), and its final test accuracy counts as 0")
            break
        cell.rows.append({**row, **{f"sec_{p}": v for p, v in timer.sec.items()}})
        if schedule.checkpoints(cell.step):
            # the checkpoint holds this row before its own writing time is known: NaN there (what a
            # run resumed from it keeps), the time itself here once written
            cell.rows[-1]["sec_checkpoint"] = math.nan
            with timer("checkpoint"):
                tr.save_checkpoint(ckpt, cell, run)
            cell.rows[-1]["sec_checkpoint"] = timer.sec["checkpoint"]
        trackers.log(cell.step, cell.rows[-1])
        for p_, v in timer.sec.items():
            totals[p_] += v
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward_mean']:+.2f}", ess=f"{row['ess_lag']:.2f}")
        if row["resync"]:
            note(f"step {cell.step}: lag ESS below {tr.tcfg.resync_ess}: resynchronized the sampler")
    bar.close()
    return totals
