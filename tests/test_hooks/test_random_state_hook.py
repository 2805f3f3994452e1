"""RandomStateHook: a resumed run draws the random numbers the
uninterrupted run drew. Real Runners (epoch- and iteration-based, with a
validation between the checkpoint and the next epoch), a hook that draws
from Python's, numpy's and torch's generators after every iteration, a run
ended after its checkpoint and resumed; and the same without the hook,
which must differ (the check can fail)."""
import random

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.logging import MessageHub
from mmengine.runner import EpochBasedTrainLoop, Runner

from mmstats.hooks import RandomStateHook
from mmstats.launch import allow_mmengine_checkpoints
from mmstats.random_state import (capture_random_state, gather_states,
                                  restore_random_state)
from tests.helpers.runner import toy_cfg

ITERS = 10  # 160 samples, batch 16


class DrawsHook(Hook):
    """Before every training iteration: one draw of each generator (the
    numbers the iteration's dropout would get; the loader's augmentation
    drew before it); ends the run after ``stop_at`` iterations (a
    preempted job, after its checkpoint)."""

    priority = 'LOWEST'

    def __init__(self, stop_at=None) -> None:
        self.draws, self.stop_at = {}, stop_at

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.draws[runner.iter + 1] = (random.random(), np.random.rand(),
                                       torch.rand(1).item())

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        if self.stop_at == runner.iter + 1:
            runner.train_loop.stop_training = True


def _train(work_dir, by_epoch, with_hook, stop_at=None, resume=False):
    if by_epoch:  # a checkpoint every epoch, validation after each
        cfg = toy_cfg(work_dir, max_epochs=3)
        cfg.default_hooks.checkpoint.interval = 1
    else:  # a checkpoint every 5 iterations, validation at 5 and 10
        cfg = toy_cfg(work_dir, by_epoch=False, max_iters=15, val_interval=5)
        cfg.default_hooks.checkpoint.interval = 5
    if with_hook:
        cfg.custom_hooks = [dict(type='mmstats.RandomStateHook')]
    cfg.resume = resume
    allow_mmengine_checkpoints()  # what tools/train.py does for --resume
    runner = Runner.from_cfg(cfg)
    draws = DrawsHook(stop_at)
    runner.register_hook(draws)
    runner.train()
    return draws.draws


@pytest.mark.parametrize('by_epoch', [True, False], ids=['epoch', 'iter'])
def test_a_resumed_run_draws_what_the_uninterrupted_one_drew(
        tmp_path, clean_mmengine, by_epoch):
    stop = ITERS if by_epoch else 10
    total = 3 * ITERS if by_epoch else 15
    full = _train(tmp_path / 'full', by_epoch, True)
    _train(tmp_path / 'part', by_epoch, True, stop_at=stop)
    resumed = _train(tmp_path / 'part', by_epoch, True, resume=True)
    assert sorted(resumed) == list(range(stop + 1, total + 1))
    assert all(resumed[i] == full[i] for i in resumed)
    # without the hook mmengine reseeds: the resumed run repeats draws
    plain = _train(tmp_path / 'plain_full', by_epoch, False)
    _train(tmp_path / 'plain', by_epoch, False, stop_at=stop)
    again = _train(tmp_path / 'plain', by_epoch, False, resume=True)
    assert any(again[i] != plain[i] for i in again)


class _Runner:
    """What the hook reads of a Runner: hooks, hub, loop, counters."""

    def __init__(self, hooks, epoch=0, iter=0, max_epochs=3) -> None:
        self.hooks, self.epoch, self.iter = hooks, epoch, iter
        self.max_epochs, self.max_iters = max_epochs, 30
        self.message_hub = MessageHub.get_instance('test_random_state')
        self.train_loop = EpochBasedTrainLoop.__new__(EpochBasedTrainLoop)

    def save_checkpoint(self, *args, **kwargs) -> None:
        pass


def test_states_are_gathered_whenever_a_checkpoint_is_saved(clean_mmengine):
    """The runner's save_checkpoint gathers first (whoever calls it), and
    is the class's own again after the run."""
    hook = RandomStateHook()
    runner = _Runner([hook])
    saved = []
    runner.save_checkpoint = lambda *a, **k: saved.append(
        runner.message_hub.get_info('mmstats/random_states'))
    ours = runner.save_checkpoint
    hook.before_train(runner)
    assert runner.message_hub.get_info('mmstats/random_states') is None
    runner.save_checkpoint('dir', filename='best.pth')
    assert len(saved) == 1 and len(saved[0]) == 1
    assert torch.equal(saved[0][0]['torch'], torch.get_rng_state())
    hook.after_run(runner)
    assert runner.save_checkpoint is ours  # not someone else's wrapper


def _best_and_last(work_dir):
    """An epoch run with save_best (a best checkpoint after each epoch's
    validation, periodic ones never), validation drawing too."""
    cfg = toy_cfg(work_dir, max_epochs=2)
    cfg.default_hooks.checkpoint.save_best = 'auto'
    cfg.default_hooks.checkpoint.rule = 'greater'
    cfg.custom_hooks = [dict(type='mmstats.RandomStateHook')]
    allow_mmengine_checkpoints()
    runner = Runner.from_cfg(cfg)
    states = {}

    class Record(Hook):
        priority = 'LOWEST'

        def after_train_epoch(self, runner) -> None:
            states[runner.epoch + 1] = torch.get_rng_state()  # 1-based

        def before_val_iter(self, runner, batch_idx, data_batch=None):
            torch.rand(1)  # validation draws from its own states

    runner.register_hook(Record())
    runner.train()
    return states


def test_best_and_last_checkpoints_carry_the_training_states(
        tmp_path, clean_mmengine):
    states = _best_and_last(tmp_path)
    ckpts = {p.name: p for p in tmp_path.glob('*.pth')}
    best = [name for name in ckpts if name.startswith('best_')]
    assert best and 'epoch_2.pth' in ckpts, sorted(ckpts)
    for name in best + ['epoch_2.pth']:
        epoch = int(name.rpartition('_')[2][:-len('.pth')])
        ckpt = torch.load(ckpts[name], map_location='cpu')
        gathered = ckpt['message_hub']['runtime_info']['mmstats/random_states']
        assert torch.equal(gathered[0]['torch'], states[epoch]), name


def test_another_world_size_warns_and_keeps_the_new_seed(
        clean_mmengine, capsys):
    hook = RandomStateHook()
    runner = _Runner([hook])
    runner.message_hub.update_info('mmstats/random_states',
                                   [capture_random_state()] * 2)
    hook.before_train(runner)
    before = torch.get_rng_state()
    hook.before_train_epoch(runner)
    assert torch.equal(torch.get_rng_state(), before)
    assert 'states of 2 processes and this run has 1' in capsys.readouterr(
    ).out


def test_validation_draws_leave_training_states_alone():
    hook = RandomStateHook()
    state = capture_random_state()
    hook.before_val(None)
    torch.rand(3), np.random.rand(), random.random()
    hook.after_val(None)
    assert torch.equal(torch.get_rng_state(), state['torch'])
    restore_random_state(state)


def test_states_round_trip_and_pickle_as_plain_values():
    import pickle
    state = capture_random_state()
    a = (random.random(), np.random.rand(), torch.rand(2))
    restore_random_state(pickle.loads(pickle.dumps(state)))
    b = (random.random(), np.random.rand(), torch.rand(2))
    assert a[:2] == b[:2] and torch.equal(a[2], b[2])
    assert isinstance(state['numpy'][1], list)  # weights_only loads it
    assert len(gather_states()) == 1
