# Copyright (c) mmstats contributors. All rights reserved.
"""RandomStateHook: a resumed run draws the random numbers the
uninterrupted run would have drawn."""
from __future__ import annotations
import logging
from typing import TYPE_CHECKING, List, Optional

from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log

from mmstats.publish import find_hook
from mmstats.random_state import (capture_random_state, gather_states,
                                  restore_random_state)
from mmstats.registry import HOOKS
from mmstats.utils.args import check_keywords

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['RandomStateHook']

#: the message hub's runtime-info key of every rank's generator states
INFO_KEY = 'mmstats/random_states'


@HOOKS.register_module()
@check_keywords
class RandomStateHook(Hook):
    """Save every rank's random generator states with each checkpoint and
    restore them when the run resumes; validation draws from a state of its
    own (``docs/checkpoints.md``).

    mmengine reseeds the generators at resume, so a resumed run repeats the
    random draws of the first epoch (data augmentation, the loaders' seeds,
    dropout) instead of continuing them. Just before ``CheckpointHook``
    writes a checkpoint, this hook gathers every rank's states (Python,
    numpy, torch, CUDA: one ``all_gather_object``) into the message hub,
    which every strategy saves; after a resume each rank restores its own
    right before the first batch is drawn (after the ``IterBasedTrainLoop``
    has skipped the batches it had trained). Validation restores the state
    it found when it ends, so a run with a checkpoint between training and
    validation and a resumed one draw the same numbers. A resume on another
    number of processes warns and keeps the reseeded generators.

    ``tools/train.py`` registers it; other launchers add
    ``dict(type='mmstats.RandomStateHook')`` to ``custom_hooks``.

    Example:
        >>> hook = RandomStateHook()
        >>> hook.priority
        'LOW'
    """

    priority = 'LOW'  # after the hooks that draw, before CheckpointHook

    def __init__(self) -> None:
        self._resumed: Optional[List[dict]] = None
        self._before_val: Optional[dict] = None
        self._by_epoch = True
        self._checkpoint: Optional[CheckpointHook] = None  # the runner's

    def before_train(self, runner: Runner) -> None:
        """A resumed run's states (from its message hub), to restore when
        the first batch is drawn."""
        from mmengine.runner import EpochBasedTrainLoop
        self._by_epoch = isinstance(runner.train_loop, EpochBasedTrainLoop)
        self._checkpoint = find_hook(runner, CheckpointHook)  # once a run
        states = runner.message_hub.get_info(INFO_KEY)
        self._resumed = None
        if states is None:
            return
        if len(states) != get_world_size():
            print_log(
                f'RandomStateHook: the checkpoint holds the random states '
                f'of {len(states)} processes and this run has '
                f'{get_world_size()}: the generators keep their new seeds '
                '(the resumed run draws other random numbers than the '
                'uninterrupted one would)',
                'current',
                level=logging.WARNING)
            return
        self._resumed = states

    def before_train_epoch(self, runner: Runner) -> None:
        """Epoch loop: restore before the epoch's loader iterator exists."""
        if self._by_epoch:
            self._restore()

    def before_train_iter(self,
                          runner: Runner,
                          batch_idx: int,
                          data_batch: Optional[dict] = None) -> None:
        """Iteration loop: restore after the loop skipped trained batches
        (the batch of this iteration is already drawn, as it was when the
        states were saved)."""
        self._restore()

    def after_train_iter(self,
                         runner: Runner,
                         batch_idx: int,
                         data_batch: Optional[dict] = None,
                         outputs: Optional[dict] = None) -> None:
        """Gather the states where CheckpointHook saves by iteration."""
        if self._saves_now(runner, by_epoch=False):
            self._store(runner)

    def after_train_epoch(self, runner: Runner) -> None:
        """Gather the states where CheckpointHook saves by epoch."""
        if self._saves_now(runner, by_epoch=True):
            self._store(runner)

    def before_val(self, runner: Runner) -> None:
        """Validation draws from its own copy of the states."""
        self._before_val = capture_random_state()

    def after_val(self, runner: Runner) -> None:
        """Back to the states training had."""
        if self._before_val is not None:
            restore_random_state(self._before_val)
            self._before_val = None

    def _saves_now(self, runner: Runner, by_epoch: bool) -> bool:
        """CheckpointHook's own rule: it saves at this epoch (iteration)."""
        checkpoint = self._checkpoint
        if checkpoint is None or checkpoint.by_epoch != by_epoch:
            return False
        if by_epoch:
            return self.every_n_epochs(
                runner, checkpoint.interval, checkpoint.save_begin) or (
                    checkpoint.save_last and self.is_last_train_epoch(runner))
        return self.every_n_train_iters(
            runner, checkpoint.interval,
            checkpoint.save_begin) or (checkpoint.save_last
                                       and self.is_last_train_iter(runner))

    def _store(self, runner: Runner) -> None:
        runner.message_hub.update_info(INFO_KEY, gather_states())

    def _restore(self) -> None:
        if self._resumed is not None:
            restore_random_state(self._resumed[get_rank()])
            self._resumed = None
