# Copyright (c) mmstats contributors. All rights reserved.
"""CheckpointHook: mmengine's, such that a run that stops costs at most one
step (``docs/checkpoints.md``, "When a run stops")."""
from __future__ import annotations
import inspect
import os.path as osp
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from mmengine.dist import get_rank, get_world_size, is_main_process
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook as MMEngineCheckpointHook
from mmengine.logging import print_log

from mmstats.checkpoints import (Preempted, StopRequest, agree, finish_save,
                                 partial_name, refuse_damaged,
                                 remove_checkpoint, write_last_checkpoint)
from mmstats.checkpoints.stop import agree_min
from mmstats.random_state import (STATES_HELD_KEY, STATES_KEY,
                                  capture_random_state, gather_states,
                                  restore_random_state)
from mmstats.registry import HOOKS
from mmstats.utils.args import check_keywords

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['CheckpointHook']

#: message hub keys of a preemption checkpoint (runtime info)
PREEMPTED_KEY = 'mmstats/preempted_checkpoint'
SKIP_KEY = 'mmstats/preempted_skip_batches'
START_KEY = 'mmstats/preempted_start_states'
STOP_KEY = 'mmstats/preempted_stop_states'
VAL_KEY = 'mmstats/preempted_in_val'
#: (epoch, iter) the preempted run stood at: FlexibleRunner's save writes
#: an epoch-end or iteration-end position into ``meta`` whatever it is given
POSITION_KEY = 'mmstats/preempted_position'
#: the scheme ``tools/test.py`` gives a directory it reads whole
SCHEMES = ('consolidate://', )


@HOOKS.register_module()
@check_keywords
class CheckpointHook(MMEngineCheckpointHook):
    """mmengine's ``CheckpointHook`` (every argument of it, the same
    behaviour), with three things more:

    - **A save is complete or absent.** A checkpoint is written as
      ``NAME.partial`` and renamed to ``NAME`` once every rank's part is
      written (a directory gets ``mmstats_complete.json``, its files and
      sizes, first); ``last_checkpoint`` is replaced after that and the
      checkpoint ``max_keep_ckpts`` drops is removed last (mmengine removes
      it before the save: a crash then loses the run). Local ``out_dir``
      only; another file backend saves as mmengine does.
    - **A damaged checkpoint is refused** at ``before_run`` (``load_from``,
      ``resume``), on every rank together, naming the path and what is
      wrong (mmstats' launchers check it before the runner loads, for a
      ``FlexibleRunner`` too, which loads before ``before_run``).
    - **Preemption**: a signal of ``stop_signals`` reaching any rank makes
      every rank save ``iter_N_preempted.pth`` at the next iteration
      boundary, in training or in a validation loop, then raise
      :class:`~mmstats.checkpoints.Preempted` (exit status 75). ``--resume``
      continues exactly: a checkpoint written mid-epoch resumes mid-epoch
      (the trained batches are drawn again, not trained: their random
      draws replayed), one written during validation resumes after it.

    ``tools/train.py``, ``dist_train.sh``, ``slurm_train.sh`` and
    ``mmstats-train`` put it in place of mmengine's ``CheckpointHook``
    (same arguments); other launchers name it:
    ``default_hooks.checkpoint.type='mmstats.CheckpointHook'``.

    Args:
        *args: mmengine's ``CheckpointHook`` arguments (a keyword it does not
            name is refused at build: mmengine would pass it on to
            ``runner.save_checkpoint`` and fail at the first save).
        stop_signals (Sequence[str], optional): The signals that stop the
            run with a checkpoint. None or ``()`` switches preemption
            handling off. Defaults to ``('SIGTERM', 'SIGUSR1')``.
        **kwargs: mmengine's ``CheckpointHook`` arguments.

    Example:
        >>> hook = CheckpointHook(interval=1, max_keep_ckpts=1)
        >>> sorted(hook.stop.numbers)
        ['SIGTERM', 'SIGUSR1']
    """

    def __init__(self,
                 *args: Any,
                 stop_signals: Union[None, str,
                                     Sequence[str]] = ('SIGTERM', 'SIGUSR1'),
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop = StopRequest(stop_signals) if stop_signals else None
        self._training = False
        self._epoch_states: Optional[dict] = None  # at the epoch's start
        self._val_states: Optional[dict] = None  # training's, at validation
        self._val_checks = 0  # validation iterations every rank runs
        self._preempted: Optional[str] = None  # the resumed one, to remove
        # a resumed preemption's states: at the loop's start, at the stop;
        # the batches of the epoch trained before it
        self._resumed: tuple = (None, None, 0)

    # mmengine's arguments by name and stop_signals, nothing else: mmengine
    # hands unknown keywords to runner.save_checkpoint, which takes none
    # beyond them (a misspelt one failed at the first save); here
    # check_keywords refuses it at build, naming the closest argument
    __init__.__signature__ = inspect.Signature([
        p for p in inspect.signature(MMEngineCheckpointHook.__init__).
        parameters.values() if p.kind is not p.VAR_KEYWORD
    ] + [
        inspect.Parameter(
            'stop_signals',
            inspect.Parameter.KEYWORD_ONLY,
            default=('SIGTERM', 'SIGUSR1'))
    ])

    # -- loading -----------------------------------------------------------
    def before_run(self, runner: Runner) -> None:
        """Refuse a damaged ``load_from`` (every rank together); handle the
        stop signals."""
        refuse_loaded_checkpoint(runner.cfg)
        if self.stop is not None:
            self.stop.install()

    def after_run(self, runner: Runner) -> None:
        """The previous signal handlers back."""
        if self.stop is not None:
            self.stop.uninstall()

    def before_train(self, runner: Runner) -> None:
        """mmengine's, and what a resumed preemption checkpoint left to do:
        the validation it interrupted, then (at the loop's start) the
        batches it had trained drawn again with the random states they
        were drawn with."""
        super().before_train(runner)
        self._training = True
        info = runner.message_hub.runtime_info
        self._preempted = info.pop(PREEMPTED_KEY, None)
        start, stop = info.pop(START_KEY, None), info.pop(STOP_KEY, None)
        self._resumed = (start, stop, info.pop(SKIP_KEY, 0))
        position = info.pop(POSITION_KEY, None)
        if position is not None:  # where the preempted run stood
            loop = runner.train_loop
            loop._epoch, loop._iter = position
            print_log(
                f'CheckpointHook: resuming the preempted run at epoch '
                f'{position[0] + 1}, iteration {position[1] + 1}', 'current')
        if info.pop(VAL_KEY, False):
            print_log(
                'CheckpointHook: the validation the preemption stopped '
                'runs again', 'current')
            runner.val_loop.run()

    def after_train(self, runner: Runner) -> None:
        """mmengine's; training is over."""
        self._training = False
        super().after_train(runner)

    def before_train_epoch(self, runner: Runner) -> None:
        """A resumed preemption's replay set up (the first time); the
        generators' states before the loader draws (the loop's start in
        an ``IterBasedTrainLoop``), which a preemption checkpoint holds."""
        if self.stop is None:
            return
        start, stop, skip = self._resumed
        self._resumed = (None, None, 0)
        if start is not None and len(start) == get_world_size():
            restore_random_state(start[get_rank()])
            from mmengine.runner import EpochBasedTrainLoop
            after = self._restorer(stop)
            if isinstance(runner.train_loop, EpochBasedTrainLoop):
                if skip:
                    SkipTrainedBatches(runner.train_loop, skip, after)
            elif stop is not None:
                RestoreAfterSkip(runner.train_loop, runner.iter, after)
        self._epoch_states = capture_random_state()

    @staticmethod
    def _restorer(states: Optional[list]) -> Callable:

        def restore() -> None:
            if states is not None:
                restore_random_state(states[get_rank()])

        return restore

    # -- saving ------------------------------------------------------------
    def _local(self) -> bool:
        return isinstance(self.file_backend, LocalBackend)

    def _write(self, runner: Runner, filename: str, meta: dict) -> str:
        """Save ``filename`` complete or not at all (every rank)."""
        final = osp.join(self.out_dir, filename)
        runner.save_checkpoint(
            self.out_dir,
            partial_name(filename),
            self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args)
        finish_save(osp.join(self.out_dir, partial_name(filename)), final)
        if is_main_process():
            write_last_checkpoint(runner.work_dir, final)
        return final

    def _save_checkpoint_with_step(self, runner: Runner, step: int,
                                   meta: dict) -> None:
        """mmengine's, in the order that never loses the last complete
        checkpoint: write, complete, ``last_checkpoint``, then remove."""
        if not self._local():
            return super()._save_checkpoint_with_step(runner, step, meta)
        dropped = None
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and
                                            self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                dropped = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids',
                                           list(self.keep_ckpt_ids))
        filename = self.filename_tmpl.format(step)
        self.last_ckpt = osp.join(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        self._write(runner, filename, meta)
        if not is_main_process():
            return
        if dropped is not None:
            remove_checkpoint(
                osp.join(self.out_dir, self.filename_tmpl.format(dropped)))
        if self._preempted is not None:  # a newer complete one exists
            remove_checkpoint(self._preempted)
            self._preempted = None

    # -- preemption --------------------------------------------------------
    def after_train_iter(self,
                         runner: Runner,
                         batch_idx: int,
                         data_batch: Any = None,
                         outputs: Optional[dict] = None) -> None:
        """mmengine's save by iteration; then stop if any rank was asked."""
        super().after_train_iter(runner, batch_idx, data_batch, outputs)
        if self.stop is not None and agree(self.stop.requested):
            self._stop(runner, in_val=False, batch_idx=batch_idx)

    def before_val(self, runner: Runner) -> None:
        """Training's generator states, and the validation iterations every
        rank runs (a stop is agreed on those only)."""
        if self.stop is not None and self._training:
            self._val_states = capture_random_state()
            self._val_checks = agree_min(len(runner.val_dataloader))

    def after_val_iter(self,
                       runner: Runner,
                       batch_idx: int,
                       data_batch: Any = None,
                       outputs: Optional[Sequence] = None) -> None:
        """Stop inside a validation loop of training too."""
        if (self.stop is not None and self._training
                and batch_idx < self._val_checks
                and agree(self.stop.requested)):
            self._stop(runner, in_val=True, batch_idx=batch_idx)

    def _stop(self, runner: Runner, in_val: bool, batch_idx: int) -> None:
        """Save on every rank, then raise Preempted."""
        from mmengine.runner import EpochBasedTrainLoop
        by_epoch = isinstance(runner.train_loop, EpochBasedTrainLoop)
        info = runner.message_hub
        if in_val:  # training stands after its epoch / iteration
            meta = dict(epoch=runner.epoch, iter=runner.iter)
            start, stop, skip = ((self._val_states, None, 0) if by_epoch else
                                 (self._epoch_states, self._val_states, 0))
        else:  # an epoch loop resumes mid-epoch, even after its last batch
            meta = dict(epoch=runner.epoch, iter=runner.iter + 1)
            start, stop = self._epoch_states, capture_random_state()
            skip = batch_idx + 1 if by_epoch else 0
        info.update_info(START_KEY, gather_states(start))
        info.update_info(STOP_KEY,
                         None if stop is None else gather_states(stop))
        info.update_info(SKIP_KEY, skip)
        info.update_info(VAL_KEY, in_val)
        info.update_info(POSITION_KEY, (meta['epoch'], meta['iter']))
        info.update_info(STATES_KEY, None)  # restored here, not by
        info.update_info(STATES_HELD_KEY, True)  # (for this save)
        # RandomStateHook: before the loader draws, then after the replay
        filename = f'iter_{meta["iter"]}_preempted.pth'
        path = osp.join(self.out_dir, filename)
        info.update_info(PREEMPTED_KEY, path)
        name = self.stop.signal_name or 'a signal to another rank'
        print_log(
            f'CheckpointHook: {name}: saving {path} and stopping '
            f'({"validation" if in_val else "training"}, iteration '
            f'{meta["iter"]})', 'current')
        if self._local():
            self._write(runner, filename, meta)
        else:
            runner.save_checkpoint(
                self.out_dir,
                filename,
                meta=meta,
                by_epoch=self.by_epoch,
                **self.args)
        self.stop.uninstall()  # saved: a signal now may end the process
        raise Preempted(name, path)


def refuse_loaded_checkpoint(cfg: Any) -> None:
    """:func:`~mmstats.checkpoints.refuse_damaged` of what ``cfg`` loads
    (``load_from``, resumed when ``resume``), on every rank; nothing
    without ``load_from``.

    Example:
        >>> refuse_loaded_checkpoint(dict(load_from=None))
    """
    path = cfg.get('load_from')
    if not path or not isinstance(path, str):
        return
    for scheme in SCHEMES:
        if path.startswith(scheme):
            path = path[len(scheme):]
    if '://' in path:  # another file backend: not looked at
        return
    refuse_damaged(path, resume=bool(cfg.get('resume')))


class SkipTrainedBatches:
    """The first ``count`` batches of the next epoch drawn, not trained:
    the ``EpochBasedTrainLoop``'s ``run_iter`` passes them over (batch
    indices stay the uninterrupted run's), then ``after`` runs (the
    generators' states at the stop) and the loop's own ``run_iter`` is
    back."""

    def __init__(self, loop: Any, count: int, after: Callable) -> None:
        self.loop, self.count, self.after = loop, count, after
        self.run_iter = loop.run_iter
        loop.run_iter = self

    def __call__(self, idx: int, data_batch: Any) -> None:
        if idx < self.count:
            if idx + 1 == self.count:
                del self.loop.run_iter  # the class's method again
                self.after()
            return
        self.run_iter(idx, data_batch)  # pragma: no cover - removed first


class RestoreAfterSkip:
    """An ``IterBasedTrainLoop``'s loader iterator that runs ``after`` (the
    generators' states at the stop) once the loop has skipped the ``count``
    batches it had trained, before it draws the next, then steps aside."""

    def __init__(self, loop: Any, count: int, after: Callable) -> None:
        self.loop, self.count, self.after = loop, count, after
        self.iterator = loop.dataloader_iterator
        loop.dataloader_iterator = self

    def __iter__(self) -> 'RestoreAfterSkip':
        return self

    def __next__(self) -> Any:
        if self.count == 0:
            self.loop.dataloader_iterator = self.iterator
            self.after()
        self.count -= 1
        return next(self.iterator)
