"""Which steps probe, evaluate and checkpoint (phases.Schedule): the one schedule the loop, the
calibration and the cost model read."""

from dlcrepro.core.config import TrainConfig
from dlcrepro.core.phases import Schedule


def test_probes_and_evals_every_so_many_steps_and_at_the_last():
    s = Schedule(steps=7, probe_every=2, eval_every=4, ckpt_every=3)
    assert [k for k in range(1, 8) if s.probes(k)] == [2, 4, 6, 7]
    assert [k for k in range(1, 8) if s.evaluates(k)] == [4, 7]


def test_a_checkpoint_every_so_many_steps_but_not_after_the_last():
    assert [k for k in range(1, 10) if Schedule(9, 1, 1, 3).checkpoints(k)] == [3, 6]
    assert not any(Schedule(9, 1, 1, 0).checkpoints(k) for k in range(1, 10))


def test_counts_from_a_first_step_and_the_steps_a_failure_can_lose():
    s = Schedule(40, 1, 10, 10)
    assert s.count(s.evaluates) == 4 and s.count(s.evaluates, first=31) == 1 and s.count(s.checkpoints) == 3
    assert s.steps_lost_at_most() == 10 and Schedule(40, 1, 10, 0).steps_lost_at_most() == 40


def test_a_configs_schedule_with_overrides():
    t = TrainConfig()
    assert Schedule.of(t) == Schedule(t.steps, t.probe_every, t.eval_every, t.ckpt_every)
    assert Schedule.of(t, steps=2, ckpt_every=1).checkpoints(1)
