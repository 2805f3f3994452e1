# Copyright (c) mmstats contributors. All rights reserved.
"""RandomStateHook: a resumed run draws the random numbers the
uninterrupted run would have drawn."""
from __future__ import annotations
import functools
import logging
from typing import TYPE_CHECKING, List, Optional

from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.logging import print_log

from mmstats.random_state import (STATES_HELD_KEY, STATES_KEY,
                                  capture_random_state, gather_states,
                                  restore_random_state)
from mmstats.registry import HOOKS
from mmstats.utils.args import check_keywords

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['RandomStateHook']

#: the message hub's runtime-info key of every rank's generator states (one
#: name with CheckpointHook's preemption save)
INFO_KEY = STATES_KEY


@HOOKS.register_module()
@check_keywords
class RandomStateHook(Hook):
    """Save every rank's random generator states with each checkpoint and
    restore them when the run resumes; validation draws from a state of its
    own (``docs/checkpoints.md``).

    mmengine reseeds the generators at resume, so a resumed run repeats the
    random draws of the first epoch (data augmentation, the loaders' seeds,
    dropout) instead of continuing them. Whenever a checkpoint is written
    (``runner.save_checkpoint``: ``CheckpointHook``'s periodic, last and
    best checkpoints alike), this hook first gathers every rank's training
    states (Python, numpy, torch, CUDA: one ``all_gather_object``) into the
    message hub, which every strategy saves; after a resume each rank
    restores its own
    right before the first batch is drawn (after the ``IterBasedTrainLoop``
    has skipped the batches it had trained). Validation restores the state
    it found when it ends, so a run with a checkpoint between training and
    validation and a resumed one draw the same numbers. A resume on another
    number of processes warns and keeps the reseeded generators.

    The gather is decided where ``CheckpointHook`` decides to save, not by
    a copy of its rule: from ``before_train`` to ``after_run`` the runner's
    ``save_checkpoint`` is wrapped on this runner (the instance, not the
    class) so that the gather runs right before it. ``Runner``'s own
    ``save_checkpoint`` is ``@master_only`` and calls
    ``before_save_checkpoint`` on rank 0 only; the wrapper runs on every
    rank that calls ``save_checkpoint``, which mmengine's hooks do on every
    rank (a gather is a collective: code that saves on rank 0 only must
    save through ``runner.save_checkpoint`` on every rank too). A "best"
    checkpoint, written during validation, carries training's states (set
    aside by ``before_val``), not validation's.

    ``tools/train.py`` registers it; other launchers add
    ``dict(type='mmstats.RandomStateHook')`` to ``custom_hooks``.

    Example:
        >>> hook = RandomStateHook()
        >>> hook.priority
        'LOW'
    """

    priority = 'LOW'  # before_val: after the hooks that draw

    def __init__(self) -> None:
        self._resumed: Optional[List[dict]] = None
        self._before_val: Optional[dict] = None
        self._by_epoch = True
        # (runner, its own save_checkpoint attribute or None, the wrapper)
        self._wrapped: Optional[tuple] = None

    def before_train(self, runner: Runner) -> None:
        """Wrap the runner's ``save_checkpoint`` (every checkpoint carries
        the states); a resumed run's states (from its message hub), to
        restore when the first batch is drawn."""
        from mmengine.runner import EpochBasedTrainLoop
        self._by_epoch = isinstance(runner.train_loop, EpochBasedTrainLoop)
        self._wrap_save(runner)
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

    def after_run(self, runner: Runner) -> None:
        """The runner's own ``save_checkpoint`` again."""
        self._unwrap_save()

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

    def before_val(self, runner: Runner) -> None:
        """Validation draws from its own copy of the states."""
        self._before_val = capture_random_state()

    def after_val(self, runner: Runner) -> None:
        """Back to the states training had."""
        if self._before_val is not None:
            restore_random_state(self._before_val)
            self._before_val = None

    def _wrap_save(self, runner: Runner) -> None:
        """``runner.save_checkpoint`` gathers the states first, on every
        rank that calls it (before ``Runner``'s ``@master_only``)."""
        self._unwrap_save()
        save = runner.save_checkpoint
        hook = self

        @functools.wraps(save)
        def save_checkpoint(*args, **kwargs):
            info = runner.message_hub
            if info.get_info(STATES_HELD_KEY):  # this save keeps its own
                info.update_info(STATES_HELD_KEY, False)
            else:  # validation set training's states aside: resumed
                info.update_info(INFO_KEY, gather_states(hook._before_val))
            return save(*args, **kwargs)

        # what the instance had (another wrapper) or None (the class's)
        self._wrapped = (runner, vars(runner).get('save_checkpoint'),
                         save_checkpoint)
        runner.save_checkpoint = save_checkpoint

    def _unwrap_save(self) -> None:
        if self._wrapped is None:
            return
        runner, before, ours = self._wrapped
        self._wrapped = None
        if vars(runner).get('save_checkpoint') is not ours:
            return  # wrapped again since: left as it is
        if before is None:
            del runner.save_checkpoint  # the class's method again
        else:
            runner.save_checkpoint = before

    def _restore(self) -> None:
        if self._resumed is not None:
            restore_random_state(self._resumed[get_rank()])
            self._resumed = None
