"""The run's clock (book/eng_clock.ipynb): the budget spent, the cadences of last.pt and of validation points, the
time outside training steps. Expected values are worked out by hand in each test, not by the clock."""
import math
import time

import pytest

from transformer_lib.clock import OVERHEAD_PARTS, RunClock, patch_to
from transformer_lib.config import TrainConfig


def clock(**settings) -> RunClock:
    """A clock of the tiny preset (no max_minutes, no eval_* cadence, no cooldown) with settings changed."""
    return RunClock(TrainConfig.from_preset("tiny", **settings))


def test_patch_to_sets_a_method_and_the_trainer_still_exports_it():
    from transformer_lib.trainer import patch_to as trainers

    class Box:
        pass

    @patch_to(Box)
    def size(self) -> int:
        return 3

    assert Box().size() == 3 and trainers is patch_to
    assert size.__qualname__ == "Box.size" and Box.size is size  # the function, returned and named


def test_patch_to_names_the_clocks_methods_staticmethod_and_context_manager_included():
    assert RunClock.minutes.__qualname__ == "RunClock.minutes"
    assert RunClock.describe.__qualname__ == "RunClock.describe"  # a staticmethod's function
    assert RunClock.timed.__qualname__ == "RunClock.timed"  # the context manager's wrapper


def test_points_by_eval_epochs_in_epochs_of_different_lengths():
    # 10 micro-batches, then 8, one a step; done as Trainer.agree counts it, in each epoch's own micro-batches:
    # half an epoch is 5 micro-batches in the first and 4 in the second, so points at steps 5, 10, then 14, 18
    c = clock(eval_epochs=0.5)
    points, step = [], 0
    for epoch, n_batches in enumerate([10, 8]):
        for position in range(1, n_batches + 1):
            step += 1
            done = epoch * n_batches + position
            if c.point_due(step, done=done, per_step=1, n_batches=n_batches):
                points.append((step, done / n_batches))
    assert points == [(5, 0.5), (10, 1.0), (14, 1.5), (18, 2.0)]


def test_points_by_eval_epochs_need_the_nudge_at_an_exact_multiple():
    # 0.2 of 12 micro-batches, 2 a step: multiples 2.4, 4.8, 7.2, 9.6 and 12 are reached by steps 2 to 6 (done 4 ..
    # 12); 12 / (0.2 * 12) is 4.999999999999999 in floating point, so without the nudge step 6 would be missed
    c = clock(eval_epochs=0.2)
    due = [s for s in range(1, 7) if c.point_due(step=s, done=2 * s, per_step=2, n_batches=12)]
    assert due == [2, 3, 4, 5, 6]
    assert math.floor(12 / (0.2 * 12)) == 4  # the bare rule's floor at the epoch's end


def test_points_by_eval_epochs_fall_on_the_same_step_whatever_the_speed():
    # half an epoch of 8 micro-batches, one a step: steps 4 and 8, then 12 and 16 in the next epoch
    c = clock(eval_epochs=0.5)
    due = [s for s in range(1, 17) if c.point_due(step=s, done=s, per_step=1, n_batches=8)]
    c.elapsed = 10 * 60.0  # ten minutes later: the data decides, not the clock
    assert due == [4, 8, 12, 16]
    assert [s for s in range(1, 17) if c.point_due(step=s, done=s, per_step=1, n_batches=8)] == due


def test_no_cadence_means_no_point_at_any_step():
    c = clock()
    assert c.config.points_by_epoch
    assert not any(c.point_due(step=s, done=s, per_step=1, n_batches=8) for s in range(0, 40))


@pytest.mark.parametrize("settings", [dict(eval_epochs=0.5), dict(eval_every=50)])
def test_a_cadence_says_yes_at_step_0(settings):
    # 0 micro-batches "cross" the multiple 0, and 0 is a multiple of any eval_every; Trainer.begin ignores it
    assert clock(**settings).point_due(step=0, done=0, per_step=1, n_batches=8)


def test_eval_every_and_eval_minutes():
    c = clock(eval_every=3)
    assert [s for s in range(1, 10) if c.point_due(step=s, done=s, per_step=1, n_batches=100)] == [3, 6, 9]
    c = clock(eval_minutes=5.0)
    assert not c.point_due(step=1, done=1, per_step=1, n_batches=100)
    c.elapsed = 5 * 60.0  # five training minutes since the last point (at minute 0)
    assert c.point_due(step=2, done=2, per_step=1, n_batches=100)
    c.last_point = 5.0
    assert not c.point_due(step=3, done=3, per_step=1, n_batches=100)


def test_last_pt_is_due_by_steps_or_by_the_wall_clock():
    c = clock(checkpoint_every=3, checkpoint_minutes=None)
    assert [s for s in range(1, 10) if c.save_due(s)] == [3, 6, 9]
    c = clock(checkpoint_minutes=10.0)
    assert not c.save_due(5)
    c.last_save -= 10 * 60  # the last last.pt queued ten minutes ago
    assert c.save_due(5)


def test_last_pt_by_the_clock_ignores_the_training_minutes():
    c = clock(checkpoint_minutes=10.0)
    c.elapsed = 60 * 60.0  # an hour of earlier starts: a crash guard counts since the last last.pt only
    assert not c.save_due(1)


def test_out_of_budget_by_steps_and_by_minutes():
    c = clock(max_steps=8)
    assert [c.out_of_budget(s) for s in (7, 8, 9)] == [False, True, True]
    c = clock(max_minutes=60.0)
    c.elapsed = 59 * 60.0
    assert not c.out_of_budget(1)
    c.elapsed = 60 * 60.0
    assert c.out_of_budget(1)


def test_the_budget_spent_is_the_largest_fraction():
    c = clock(epochs=2, max_steps=8)  # after 4 steps of half an epoch: data 0.25, steps 0.5
    assert c.budget_spent(epochs_seen=0.5, step=4) == 0.5
    c = clock(epochs=30, max_minutes=10.0)  # 10 of 30 epochs in 4 of 10 minutes: data 1/3, minutes 0.4
    c.elapsed = 4 * 60.0
    assert 0.4 <= c.budget_spent(epochs_seen=10, step=290) < 0.4001
    c.elapsed = 1 * 60.0  # the data leads: 1/3 against 0.1
    assert c.budget_spent(epochs_seen=10, step=290) == pytest.approx(1 / 3, abs=1e-12)


def test_the_fraction_reaches_1_with_the_last_step_of_the_last_epoch():
    c = clock(epochs=2)  # no max_steps, no max_minutes: the epochs alone
    assert c.budget_spent(epochs_seen=1 + 8 / 8, step=16) == 1.0
    assert c.budget_spent(epochs_seen=1 + 7 / 8, step=15) == 15 / 16


def test_follows_budget_only_with_a_cooldown_or_late_dropout():
    assert not clock().follows_budget()  # the tiny preset: its resume is moved by no max_steps
    assert clock(cooldown=0.4).follows_budget()
    assert clock(inner_dropout_from=0.5).follows_budget()


def test_minutes_go_on_from_a_resume():
    c = clock()
    c.start()
    c.elapsed = 30 * 60.0
    assert 30 <= c.minutes() < 30.05


def test_timed_adds_the_block_to_its_part_and_the_record_sums_the_parts():
    c = clock()
    with c.timed("saving"):
        time.sleep(0.05)
    assert 0.05 <= c.overhead["saving"] < 5
    with pytest.raises(RuntimeError), c.timed("validation"):  # a block that fails is counted too
        time.sleep(0.02)
        raise RuntimeError
    assert c.overhead["validation"] >= 0.02
    c.overhead.update(start_up=4.0, first_step=2.5, validation=6.0, saving=1.5, averaging=1.0)
    c.t0 = time.perf_counter() - 100.0
    record = c.overhead_record()
    assert record["kind"] == "overhead" and 100 <= record["seconds"] < 100.5
    assert 15 / 100.5 < record["share"] <= 15 / 100  # 15 s of parts over 100 s and a little more
    line = RunClock.describe({**record, "share": 0.15, "seconds": 100.0})
    assert line == ("time outside training steps: 15.0% of 100 s (start up 4.0 s, first step 2.5 s, "
                    "validation 6.0 s, saving 1.5 s, averaging 1.0 s)")
    assert tuple(k for k in record if k in OVERHEAD_PARTS) == OVERHEAD_PARTS


def test_start_records_the_start_up():
    t0 = time.perf_counter() - 2.0  # a process that began two seconds ago
    c = RunClock(TrainConfig.from_preset("tiny"), t0=t0)
    c.start()
    assert 2.0 <= c.overhead["start_up"] < 3.0
    assert c.minutes() < 0.01  # the start-up is not training time


def test_minutes_before_start_are_the_restored_seconds_alone():
    # Trainer.begin takes its first decision before start(): the time since the clock was built (a restore's
    # loading included) is start-up, not training, so neither the minutes nor the budget spent may grow with it
    c = clock(max_minutes=60.0)
    c.elapsed = 30 * 60.0  # what a resume restores
    time.sleep(0.05)
    assert c.started is None and c.minutes() == 30.0
    assert c.budget_spent(epochs_seen=0.0, step=0) == 0.5
    c.start()
    time.sleep(0.01)
    assert 30.0 < c.minutes() < 30.05
