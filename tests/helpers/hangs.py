"""Ranks that stall, and runs that are slow but healthy, for the hang
watch's tests (``tests/test_hooks/test_hang_watch_hook.py``; configs name
these classes, registered test-only in mmengine's root registries).

A stall blocks the rank's main thread until the hang watch has written
that rank's Python stacks (``<work_dir>/hangs/rank<r>-*.txt``): the only
way out is the watch naming the rank. Without ``release`` it never ends
(the ``on_hang='exit'`` launch). After 60 s it raises, so a watch that
never reports fails the test instead of hanging it.
"""
import glob
import os.path as osp
import time
from typing import Optional

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import DATASETS, HOOKS, MODELS

from mmstats.hooks import PreciseBNHook
from .toy import ToyBNModel, ToyDataset

#: seconds a stall waits for its rank's stacks before it raises
LIMIT = 60


def stall_until_reported(work_dir: str, release: bool = True) -> None:
    """Block until this rank's stacks appear in ``work_dir/hangs`` (with
    ``release``), or forever."""
    pattern = osp.join(work_dir, 'hangs', f'rank{get_rank()}-*.txt')
    seen = len(glob.glob(pattern))
    start = time.time()
    while not release or len(glob.glob(pattern)) == seen:
        if release and time.time() - start > LIMIT:
            raise RuntimeError(f'rank {get_rank()} was never named')
        time.sleep(0.05)


@DATASETS.register_module(force=True)
class HangPlanDataset(ToyDataset):
    """ToyDataset whose first item is ``slow_start`` seconds slow on every
    rank, and whose ``stall_item``-th item (counted per rank) stalls on
    ``stall_rank``."""

    def __init__(self,
                 work_dir: str,
                 stall_rank: Optional[int] = None,
                 stall_item: int = -1,
                 slow_start: float = 0.,
                 release: bool = True,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.work_dir, self.release = work_dir, release
        self.stall_rank, self.stall_item = stall_rank, stall_item
        self.slow_start = slow_start
        self.calls = 0

    def __getitem__(self, idx: int) -> dict:
        if self.calls == 0:
            time.sleep(self.slow_start)
        if self.calls == self.stall_item and get_rank() == self.stall_rank:
            stall_until_reported(self.work_dir, self.release)
        self.calls += 1
        return super().__getitem__(idx)


@MODELS.register_module(force=True)
class HangPlanModel(ToyBNModel):
    """ToyBNModel whose first training forward takes ``slow_first`` more
    seconds on every rank (a compilation), each validation forward
    ``slow_val``, and whose ``stall_forward``-th training forward stalls on
    ``stall_rank``."""

    def __init__(self,
                 work_dir: str,
                 stall_rank: Optional[int] = None,
                 stall_forward: int = -1,
                 slow_first: float = 0.,
                 slow_val: float = 0.,
                 release: bool = True,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.work_dir, self.release = work_dir, release
        self.stall_rank, self.stall_forward = stall_rank, stall_forward
        self.slow_first, self.slow_val = slow_first, slow_val
        self.forwards = 0

    def forward(self, inputs, data_samples=None, mode='tensor'):
        if mode == 'loss':
            if self.forwards == 0:
                time.sleep(self.slow_first)
            if (self.forwards == self.stall_forward
                    and get_rank() == self.stall_rank):
                stall_until_reported(self.work_dir, self.release)
            self.forwards += 1
        elif mode == 'predict':
            time.sleep(self.slow_val)
        return super().forward(inputs, data_samples, mode)


@HOOKS.register_module(force=True)
class HangPlanHook(Hook):
    """Stalls ``hook_rank`` in its ``after_train_iter`` of iteration
    ``hook_iter``; makes the first checkpoint save ``slow_save`` seconds
    slower on every rank and stalls ``save_rank`` in the save of epoch
    ``save_epoch``."""

    def __init__(self,
                 work_dir: str,
                 hook_rank: Optional[int] = None,
                 hook_iter: int = -1,
                 save_rank: Optional[int] = None,
                 save_epoch: int = -1,
                 slow_save: float = 0.) -> None:
        self.work_dir = work_dir
        self.hook_rank, self.hook_iter = hook_rank, hook_iter
        self.save_rank, self.save_epoch = save_rank, save_epoch
        self.slow_save = slow_save
        self.saves = 0

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        if runner.iter == self.hook_iter and get_rank() == self.hook_rank:
            stall_until_reported(self.work_dir)

    def before_save_checkpoint(self, runner, checkpoint):
        if self.saves == 0:
            time.sleep(self.slow_save)
        if runner.epoch + 1 == self.save_epoch and get_rank(
        ) == self.save_rank:
            stall_until_reported(self.work_dir)
        self.saves += 1


@HOOKS.register_module(force=True)
class SlowPreciseBNHook(PreciseBNHook):
    """PreciseBNHook whose first recomputation is ``slow`` seconds slower
    (a large ``num_samples``)."""

    def __init__(self, slow: float = 0., **kwargs) -> None:
        super().__init__(**kwargs)
        self.slow, self.calls = slow, 0

    def after_train_epoch(self, runner) -> None:
        if self.calls == 0:
            time.sleep(self.slow)
        self.calls += 1
        super().after_train_epoch(runner)
