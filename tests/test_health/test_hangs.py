"""The hang watch's pieces without processes (``mmstats/health/hangs.py``,
``hang_watchdog.py``): the options, the progress record, the stall rule,
the line, the watchdog's looks on a fake clock; and one real 1-process
Runner whose phases and a stall in its optimizer step are checked (the
multi-rank runs: ``tests/test_hooks/test_hang_watch_hook.py``)."""
import glob
import json
import os.path as osp
import time

import pytest
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.runner import Runner

from mmstats.health import (HANG_EXIT_CODE, HangConfig, HangWatchdog, Progress,
                            RankRecord, find_stall)
from mmstats.health.hang_watchdog import LocalChannel
from tests.helpers.hangs import stall_until_reported
from tests.helpers.runner import toy_cfg


def rec(rank, iteration, seq, since, timeout=10., phase='data'):
    return RankRecord(rank, iteration, seq, phase, '', since, timeout, 'h',
                      100 + rank)


@pytest.mark.parametrize('timeout,error', [
    (0, ValueError),
    ('soon', TypeError),
    (dict(forwrd=3), ValueError),
    (dict(data=-1), ValueError),
])
def test_bad_timeouts_are_refused_naming_the_option(timeout, error):
    with pytest.raises(error, match='HangWatchHook: timeout'):
        HangConfig(timeout=timeout)


def test_timeouts_auto_per_phase_and_off():
    config = HangConfig(
        timeout=dict(default='auto', checkpoint_save=3600, validation=None),
        floor=300)
    assert config.timeout_of('data', None) == 900  # never completed
    assert config.timeout_of('data', 0.5) == 300  # the floor
    assert config.timeout_of('data', 60.) == 600  # 10 x its longest
    assert config.timeout_of('checkpoint_save', 1e6) == 3600
    assert config.timeout_of('validation', 5.) is None
    assert config.enabled
    assert not HangConfig(timeout=None).enabled
    assert HangConfig(timeout=7).timeout_of('hook', None) == 7


def test_progress_orders_ranks_and_keeps_normal_durations():
    clock = iter([0., 1., 2., 3., 7., 8., 9., 109., 110., 111.]).__next__
    progress = Progress(HangConfig(floor=5).timeout_of, clock=clock)
    progress.enter('data', iteration=0)  # t=1
    progress.enter('forward')  # t=2
    assert progress.state == (0, 1, 'forward', '', 2.)
    progress.enter('data', iteration=1)  # t=3: forward's first, left out
    assert progress.longest_of('forward', '') == 0.
    assert progress.longest_of('backward', '') is None  # never completed
    progress.enter('forward')  # t=7: data took 4 s
    assert progress.state[:3] == (1, 1, 'forward')
    assert progress.longest_of('data', '') == 4.
    progress.enter('data', iteration=2)  # t=8: forward took 1 s
    progress.enter('forward')  # t=9
    progress.enter('backward')  # t=109: 100 s, over its timeout (10 s)
    assert progress.longest_of('forward', '') == 1.  # not kept
    assert progress.state[:2] == (2, 2)


def test_the_stalled_are_behind_and_over_their_timeout():
    records = {
        0: rec(0, 5, 4, 0., phase='backward'),  # waiting for 100 s
        1: rec(1, 5, 0, 80.),  # behind, 20 s of 10
        2: rec(2, 5, 0, 95.),  # behind, 5 s of 10
        3: rec(3, 5, 4, 0., phase='backward'),
    }
    stall = find_stall(records, now=100.)
    assert [r.rank for r in stall.stalled] == [1]
    assert [r.rank for r in stall.waiting] == [0, 2, 3]
    assert find_stall({**records, 1: rec(1, 5, 0, 95.)}, now=100.) is None
    # rank 0, the reporter, behind: named like any other
    alone = {0: rec(0, 3, 2, 0.), 1: rec(1, 3, 5, 0.)}
    assert [r.rank for r in find_stall(alone, 50.).stalled] == [0]
    # off in that phase: never named
    assert find_stall({0: rec(0, 1, 1, 0., timeout=None)}, 1e9) is None


def test_a_second_watch_is_refused():
    """Two watches would both replace the runner's call_hook."""
    from types import SimpleNamespace

    from mmstats.hooks import HangWatchHook
    hooks = [HangWatchHook(), HangWatchHook()]
    with pytest.raises(RuntimeError, match='HangWatchHook: 2 instances'):
        hooks[0].before_run(SimpleNamespace(hooks=hooks))


def test_records_survive_the_store():
    record = rec(3, 7, 2, 1.5)
    assert RankRecord.from_text(record.to_text().encode()) == record


class _Exit(Exception):
    pass


def _exit(code):
    raise _Exit(code)


def test_the_watchdog_names_on_the_second_look_dumps_and_exits(tmp_path):
    """One rank: a stall over its timeout is named on the second look in a
    row (not the first: a record may lag one interval), with its stacks;
    'warn' repeats only after ``repeat``; 'exit' calls the exit with 114."""
    now = [100.]
    progress = Progress(clock=lambda: now[0])
    progress.enter('data', iteration=4)
    channel = LocalChannel()
    watch = HangWatchdog(
        HangConfig(timeout=10, repeat=60),
        progress,
        channel,
        0,
        1,
        str(tmp_path),
        exit_fn=_exit,
        clock=lambda: now[0])
    now[0] = 105.
    watch.tick()
    assert watch.stall is None and channel.verdict() is None
    now[0] = 111.
    watch.tick()
    assert watch.stall is None  # first look over the timeout
    now[0] = 112.
    watch.tick()
    assert [r.rank for r in watch.stall.stalled] == [0]
    assert json.loads(channel.verdict()) == dict(
        number=1, ranks=[0], exit=False)
    stacks = open(tmp_path / 'hangs' / 'rank0-1.txt').read()
    assert stacks.startswith('rank 0 of 1, host ')
    assert 'phase data  of iteration 4' in stacks
    assert 'in test_the_watchdog_names_on_the_second_look' in stacks
    now[0] = 150.
    watch.tick()  # within repeat: no new line, no new number
    assert watch.number == 1
    progress.enter('forward')  # moved on
    watch.tick()
    assert watch.stall is None
    watch.config = HangConfig(timeout=10, on_hang='exit')
    now[0] = 200.
    watch.tick()
    with pytest.raises(_Exit) as raised:
        watch.tick()
    assert raised.value.args == (HANG_EXIT_CODE, )
    assert json.loads(channel.verdict())['exit'] is True


@ROOT_HOOKS.register_module(force=True)
class StepStallHook(Hook):
    """Records the phase at each hook point; stalls in the optimizer's step
    (a step pre-hook of its own) at iteration 3 until the watch named it."""

    def __init__(self, work_dir):
        self.work_dir, self.seen = work_dir, []

    def before_train(self, runner):
        watch = [
            h for h in runner.hooks if type(h).__name__ == 'HangWatchHook'
        ][0]

        def step(*args):
            self.seen.append(watch.progress.state[2])
            if runner.iter < 3:
                time.sleep(0.6)  # healthy: 0.6 s of 1.5, 1.8 s in all
            elif runner.iter == 3:
                stall_until_reported(self.work_dir)

        runner.optim_wrapper.optimizer.register_step_pre_hook(step)


def test_one_rank_phases_and_a_stall_in_the_optimizer_step(tmp_path):
    """A real 1-process run whose first 3 steps take 0.6 s each, 1.8 s
    in all, longer than the 1.5 s timeout (a healthy run longer than it:
    no line); the rank stalls in its optimizer step at iteration 3: one
    line naming phase optimizer_step of iteration 3 and its stacks, on
    rank 0 itself."""
    work_dir = str(tmp_path)
    cfg = toy_cfg(
        work_dir,
        max_epochs=1,
        num_samples=96,
        custom_hooks=[
            dict(type='mmstats.HangWatchHook', timeout=1.5, interval=0.1),
            dict(type='StepStallHook', work_dir=work_dir)
        ])
    runner = Runner.from_cfg(cfg)
    runner.train()
    hook = [h for h in runner.hooks if type(h).__name__ == 'StepStallHook']
    assert hook[0].seen[:3] == ['optimizer_step'] * 3
    log = open(glob.glob(osp.join(work_dir, '*', '*.log'))[0]).read()
    lines = [line for line in log.splitlines() if ' - ERROR - ' in line]
    assert len(lines) == 1, lines
    assert ('Hang: rank 0 (host ' in lines[0]
            and 'phase optimizer_step of iteration 3 for ' in lines[0])
    assert 'no rank is ahead (1 in all)' in lines[0]
    stacks = open(osp.join(work_dir, 'hangs', 'rank0-1.txt')).read()
    assert 'in step\n' in stacks and 'in stall_until_reported' in stacks
