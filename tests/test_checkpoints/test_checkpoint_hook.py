"""mmstats.CheckpointHook on real Runners (one process): a crash during a
save with ``max_keep_ckpts=1`` keeps the last complete checkpoint; a
signal saves the run at the next iteration boundary (mid-epoch, in a
validation loop, in an iteration loop) and the resumed run continues
exactly: the same per-iteration losses, the same random draws (a
dataset that draws augmentation noise, a hook that draws as dropout
would), the same final weights, bitwise."""
import os
import os.path as osp
import signal

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import DATASETS
from mmengine.runner import Runner

from mmstats.checkpoints import PREEMPTED_EXIT_CODE, Preempted, resume_choice
from mmstats.launch import allow_mmengine_checkpoints
from tests.helpers.runner import clear_mmengine_singletons, toy_cfg
from tests.helpers.toy import ToyDataset

ITERS = 10  # per epoch: 160 samples, batch 16


@DATASETS.register_module(force=True)
class NoisyToyDataset(ToyDataset):
    """ToyDataset with augmentation noise drawn from torch's generator."""

    def __getitem__(self, idx: int) -> dict:
        item = super().__getitem__(idx)
        item['inputs'] = item['inputs'] + 0.1 * torch.rand(1, 8, 8)
        return item


class RecordHook(Hook):
    """Each iteration's loss and a draw (as dropout would draw); a signal
    to this process after iteration ``signal_at`` (or at the first
    validation iteration of validation number ``signal_in_val``)."""

    priority = 'HIGHEST'  # before CheckpointHook looks for a signal

    def __init__(self, signal_at=None, signal_in_val=None) -> None:
        self.losses, self.draws = {}, {}
        self.signal_at, self.signal_in_val = signal_at, signal_in_val
        self.vals = 0

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.draws[runner.iter + 1] = torch.rand(1).item()

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.losses[runner.iter + 1] = outputs['loss'].item()
        if self.signal_at == runner.iter + 1:
            os.kill(os.getpid(), signal.SIGUSR1)

    def before_val(self, runner):
        self.vals += 1

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if self.signal_in_val == self.vals and batch_idx == 0:
            os.kill(os.getpid(), signal.SIGUSR1)


def _cfg(work_dir, by_epoch, **checkpoint):
    if by_epoch:
        cfg = toy_cfg(work_dir, max_epochs=3)
    else:
        cfg = toy_cfg(work_dir, by_epoch=False, max_iters=15, val_interval=5)
    cfg.train_dataloader.dataset.type = 'NoisyToyDataset'
    cfg.default_hooks.checkpoint = dict(
        type='mmstats.CheckpointHook', by_epoch=by_epoch, **checkpoint)
    cfg.custom_hooks = [dict(type='mmstats.RandomStateHook')]
    return cfg


def _train(cfg, record=None, resume=None):
    allow_mmengine_checkpoints()  # what tools/train.py does for --resume
    if resume is not None:
        cfg.resume, cfg.load_from = True, resume
    runner = Runner.from_cfg(cfg)
    record = record or RecordHook()
    runner.register_hook(record)
    try:
        runner.train()
    finally:
        runner.message_hub.runtime_info.clear()
    return runner, record


def _weights(runner):
    return {k: v.clone() for k, v in runner.model.state_dict().items()}


class CrashingSave:
    """``runner.save_checkpoint`` that writes half of the checkpoint of
    epoch ``epoch`` and dies (a SIGKILL during the save)."""

    def __init__(self, runner, epoch):
        self.save, self.runner, self.epoch = runner.save_checkpoint, runner, \
            epoch

    def __call__(self, out_dir, filename, *args, **kwargs):
        self.save(out_dir, filename, *args, **kwargs)
        if self.runner.epoch + 1 == self.epoch:
            path = osp.join(out_dir, filename)
            with open(path, 'r+b') as f:
                f.truncate(osp.getsize(path) // 2)
            raise KeyboardInterrupt('killed during the save')


def test_a_crash_during_a_save_keeps_the_last_complete_checkpoint(
        tmp_path, clean_mmengine):
    work = str(tmp_path / 'part')
    cfg = _cfg(work, True, interval=1, max_keep_ckpts=1)
    allow_mmengine_checkpoints()
    runner = Runner.from_cfg(cfg)
    runner.save_checkpoint = CrashingSave(runner, epoch=2)
    runner.register_hook(RecordHook())  # the same draws as the others
    with pytest.raises(KeyboardInterrupt):
        runner.train()
    assert sorted(n for n in os.listdir(work)
                  if '.pth' in n) == ['epoch_1.pth', 'epoch_2.pth.partial']
    with open(osp.join(work, 'last_checkpoint')) as f:
        assert f.read() == osp.join(work, 'epoch_1.pth')
    assert resume_choice(work) == (osp.join(work, 'epoch_1.pth'), None)
    del runner
    resumed, _ = _train(
        _cfg(work, True, interval=1, max_keep_ckpts=1),
        resume=osp.join(work, 'epoch_1.pth'))
    full, _ = _train(_cfg(str(tmp_path / 'full'), True, interval=1))
    a, b = _weights(full), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the older one removed once the newer was complete; no .partial left
    assert sorted(n for n in os.listdir(work)
                  if '.pth' in n) == ['epoch_3.pth']


# (loop, where the signal comes, the iterations the preempted run trained)
CASES = {
    'mid_epoch': (True, dict(signal_at=14), 14),
    'epoch_end': (True, dict(signal_at=20), 20),
    'in_val': (True, dict(signal_in_val=1), 10),
    'iter': (False, dict(signal_at=7), 7),
    'iter_in_val': (False, dict(signal_in_val=1), 5),
}


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    """The uninterrupted runs, epoch- and iteration-based: (final weights,
    RecordHook)."""
    runs = {}
    for by_epoch in (True, False):
        clear_mmengine_singletons()
        runner, record = _train(
            _cfg(str(tmp_path_factory.mktemp('full')), by_epoch, interval=100))
        runs[by_epoch] = (_weights(runner), record)
        del runner
    clear_mmengine_singletons()
    return runs


@pytest.mark.parametrize('case', list(CASES))
def test_a_signal_saves_and_the_resumed_run_continues_exactly(
        tmp_path, clean_mmengine, uninterrupted, case):
    by_epoch, where, trained = CASES[case]
    total = 3 * ITERS if by_epoch else 15
    a, full_record = uninterrupted[by_epoch]
    work = str(tmp_path / 'part')
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(Preempted) as stop:
        _train(_cfg(work, by_epoch, interval=100), RecordHook(**where))
    assert signal.getsignal(signal.SIGUSR1) is before  # handed back
    assert stop.value.code == PREEMPTED_EXIT_CODE
    assert stop.value.signal_name == 'SIGUSR1'
    path = osp.join(work, f'iter_{trained}_preempted.pth')
    assert stop.value.checkpoint == path and osp.isfile(path)
    assert resume_choice(work) == (path, None)  # what --resume takes
    resumed, record = _train(_cfg(work, by_epoch, interval=100), resume=path)
    assert sorted(record.losses) == list(range(trained + 1, total + 1))
    for step in record.losses:
        assert record.losses[step] == full_record.losses[step], step
        assert record.draws[step] == full_record.draws[step], step
    b = _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    if 'val' in case:  # the interrupted validation ran again
        assert record.vals == full_record.vals == 3
