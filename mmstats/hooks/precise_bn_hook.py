# Copyright (c) mmstats contributors. All rights reserved.
"""PreciseBNHook: a thin mmengine hook over :mod:`mmstats.precise_bn`.

It checks its arguments, decides when to run, reads the runner and calls
the library (:func:`update_bn_stats`, its own loader from
:func:`loader_like` / :func:`loader_from_cfg`, the EMA model's modes and
statistics from :func:`mirror_modes` / :func:`swap_bn_statistics`), then
publishes: the lines it logs and its message-hub keys (kept out of
checkpoints)."""
from __future__ import annotations
import logging
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

import torch
from mmengine.hooks import EMAHook, Hook
from mmengine.hooks.hook import DATA_BATCH
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader

from mmstats.precise_bn import (check_args, check_loader_cfg, layers_to_update,
                                loader_from_cfg, loader_like, mirror_modes,
                                swap_bn_statistics, update_bn_stats)
from mmstats.publish import (PublicationSchedule, find_hook,
                             refuse_unchecked_strategy)
from mmstats.publish.step_records import join_step_records
from mmstats.registry import HOOKS
from mmstats.run_description import log_run_description
from mmstats.sharding import is_sharded, unwrap_model
from mmstats.utils.args import (check_bool, check_keywords, check_positive_int,
                                refuse_second_instance)

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['PreciseBNHook', 'VAR_CHANGE', 'EMA_VAR_CHANGE', 'HUB_KEYS']

OWNER = 'PreciseBNHook'
RUNS_KEY = 'precise_bn_runs'  # in checkpoint['meta']
VAR_CHANGE = 'train/precise_bn/var_change'
EMA_VAR_CHANGE = 'train/precise_bn/ema_var_change'
HUB_KEYS = (VAR_CHANGE, EMA_VAR_CHANGE)


@HOOKS.register_module()
@check_keywords
class PreciseBNHook(Hook):
    """Recompute BatchNorm population statistics with frozen weights.

    Every ``interval`` epochs (or iterations) the BN layers' running
    mean/var become the exact statistics of ``num_samples`` training samples
    under the current weights, identical on every rank. The hook runs before
    CheckpointHook and EMAHook (priority ``ABOVE_NORMAL``), reads the
    training *dataset* through a loader of its own (the training stream is
    never touched; its workers persist between runs) and continues its
    sampling sequence after a resume. ``precise_bn/var_change`` appears once
    per run, on the first log line after it. Details: ``docs/precise_bn.md``.

    A misspelt argument names the closest one (``num_sample=1024``: "did
    you mean num_samples?"); a second PreciseBNHook in the same run is
    refused at ``before_run``, naming both.

    Args:
        num_samples (int): Samples (over all ranks) used per recomputation.
            Defaults to 8192.
        interval (int): Run every ``interval`` epochs or iterations.
            Defaults to 1.
        by_epoch (bool, optional): True: every ``interval`` epochs; False:
            every ``interval`` iterations; None: follow the train loop.
            Defaults to None.
        at_end (bool): Also run after the last epoch/iteration when it is
            not on the interval. Defaults to True.
        estimator (str): ``'population'`` or ``'batch_average'``.
            Defaults to ``'population'``.
        dataloader (dict, optional): Config of a separate loader (with
            ``dataset`` and ``sampler``) for ``Runner.build_dataloader``.
            None reads the training dataset with a shuffled
            ``DefaultSampler``, the training batch size and ``drop_last``.
            Defaults to None.
        update_ema (bool): Also recompute the EMA model's statistics when an
            ``EMAHook`` is registered. Defaults to True.
        progress (bool): Show a progress bar on rank 0 when stdout is a
            terminal. Defaults to True.

    Example:
        >>> # in a config: custom_hooks = [dict(type='mmstats.PreciseBNHook',
        >>> #                                   num_samples=4096)]
        >>> from mmstats.registry import HOOKS
        >>> hook = HOOKS.build(dict(type='mmstats.PreciseBNHook',
        ...                         num_samples=4096, interval=2))
        >>> hook.num_samples, hook.interval, hook.priority
        (4096, 2, 'ABOVE_NORMAL')
        >>> bad = dict(type='mmstats.PreciseBNHook', by_epoch=0)  # not False
        >>> HOOKS.build(bad)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: PreciseBNHook: by_epoch must be None ...got 0 of type int...
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self,
                 num_samples: int = 8192,
                 interval: int = 1,
                 by_epoch: Optional[bool] = None,
                 at_end: bool = True,
                 estimator: str = 'population',
                 dataloader: Optional[dict] = None,
                 update_ema: bool = True,
                 progress: bool = True) -> None:
        # types are checked, not equality: 0 == False and 1.0 == True
        check_args(num_samples, estimator, owner=OWNER)
        check_positive_int(OWNER, 'interval', interval, example=1)
        check_bool(
            OWNER,
            'by_epoch',
            by_epoch,
            none_ok=True,
            meaning='None follows the train loop, True: every `interval` '
            'epochs, False: every `interval` iterations')
        for name, flag in (('at_end', at_end), ('update_ema', update_ema),
                           ('progress', progress)):
            check_bool(OWNER, name, flag)
        check_loader_cfg(dataloader, OWNER)
        self.num_samples = num_samples
        self.interval = interval
        self._by_epoch = by_epoch  # the argument; see the property
        self._epoch_loop: Optional[bool] = None  # the run's, in before_train
        self.at_end = at_end
        self.estimator = estimator
        self.dataloader_cfg = dataloader
        self.update_ema = update_ema
        self.progress = progress
        self._loader: Optional[DataLoader] = None
        self._has_bn = False  # decided per run in before_train
        self._active = False  # some BN layer to recompute (last check)
        self._num_runs = 0
        self._ema_stale = False
        self._ema_sharded = False
        self._swapped_for_val = False
        self._pending: Dict[str, float] = {}  # hub keys for the next line
        self._schedule: Optional[PublicationSchedule] = None  # its lines
        self._published: Dict[str, float] = {}  # on the hub until next iter

    @property
    def by_epoch(self) -> Optional[bool]:
        """True: runs every ``interval`` epochs; False: iterations. The
        argument, or with ``by_epoch=None`` the train loop's kind once
        training started (None before)."""
        return self._epoch_loop if self._by_epoch is None else self._by_epoch

    # -- hook points -----------------------------------------------------
    def before_run(self, runner: Runner) -> None:
        """Refuse a strategy whose numbers were never checked; take
        LoggerHook's lines (the log values join them)."""
        refuse_unchecked_strategy(runner, OWNER)
        refuse_second_instance(OWNER, runner.hooks, PreciseBNHook)
        self._schedule = PublicationSchedule(runner)
        join_step_records(runner.visualizer)  # one scalars.json record/step

    def before_train(self, runner: Runner) -> None:
        """Decide this run's schedule (``by_epoch=None`` follows the loop),
        whether the model has BN layers to recompute, and build the
        hook's own loader."""
        from mmengine.runner import EpochBasedTrainLoop
        log_run_description(runner)  # once per runner, whichever hook
        self._epoch_loop = isinstance(runner.train_loop, EpochBasedTrainLoop)
        for key in HUB_KEYS:  # e.g. from an old checkpoint
            runner.message_hub.log_scalars.pop(key, None)
        self._pending, self._published = {}, {}
        self._active = False
        model = unwrap_model(runner.model)
        self._has_bn = any(isinstance(m, _BatchNorm) for m in model.modules())
        # mmengine's EMAHook copies the model it finds: under FSDP / ZeRO-3
        # that is this rank's shards, which cannot run a forward
        self._ema_sharded = is_sharded(runner.model)
        if (self._ema_sharded and self.update_ema
                and self._ema_hook(runner) is not None):
            print_log(
                'PreciseBNHook: the model is sharded (FSDP / DeepSpeed '
                "ZeRO-3) and mmengine's EMAHook keeps a copy of this rank's "
                "shards: the EMA model's BN statistics are not recomputed "
                '(see docs/sharding.md)',
                'current',
                level=logging.WARNING)
        if not self._has_bn:
            print_log(
                'PreciseBNHook: the model has no BatchNorm layer; the '
                'hook does nothing in this run.',
                'current',
                level=logging.WARNING)
            return
        self._loader = self._build_loader(runner)
        # the modes training will use: the loop calls model.train() (which
        # honours norm_eval / frozen stages) after before_train
        self._active = bool(layers_to_update(model, train=True))
        if not self._active:
            _log_modes(None)

    def after_train_epoch(self, runner: Runner) -> None:
        """Recompute on the epoch interval (and after the last epoch)."""
        if self.by_epoch and self._due(
                self.every_n_epochs(runner, self.interval),
                self.is_last_train_epoch(runner)):
            self._run(runner)

    def after_train_iter(self,
                         runner: Runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """Take the previous line's values off the hub; recompute on the
        iteration interval; publish pending values for this line."""
        for key in self._published:  # logged on the previous line
            runner.message_hub.log_scalars.pop(key, None)
        self._published = {}
        if not self.by_epoch and self._due(
                self.every_n_train_iters(runner, self.interval),
                self.is_last_train_iter(runner)):
            self._run(runner)
        if self._pending:
            self._publish(runner, batch_idx)

    def after_train(self, runner: Runner) -> None:
        """Values of a last run that no log line followed go to the
        visualizer (scalars.json, TensorBoard) directly."""
        if self._pending:
            runner.visualizer.add_scalars(
                {
                    k.partition('/')[2]: v
                    for k, v in self._pending.items()
                },
                step=runner.iter)
            self._pending = {}

    def before_save_checkpoint(self, runner: Runner, checkpoint: dict) -> None:
        """Bring stale EMA statistics up to date; save the run count (the
        sampling sequence continues after a resume), not the hub keys."""
        self._refresh_ema(runner, unwrap_model(runner.model))
        checkpoint.setdefault('meta', {})[RUNS_KEY] = self._num_runs
        _drop_hub_keys(checkpoint)

    def after_load_checkpoint(self, runner: Runner, checkpoint: dict) -> None:
        """Continue the sampling sequence; drop the hub keys."""
        self._num_runs = int(checkpoint.get('meta', {}).get(RUNS_KEY, 0))
        _drop_hub_keys(checkpoint)  # also from checkpoints of older versions

    def before_val_epoch(self, runner: Runner) -> None:
        """Bring stale EMA statistics up to date; validate the EMA model
        with its own BN statistics, not only its parameters."""
        model = unwrap_model(runner.model)
        self._refresh_ema(runner, model)
        ema = self._ema_hook(runner)
        if ema is not None and not ema.ema_model.update_buffers:
            # mmengine swaps parameters only: bring the EMA statistics too
            swap_bn_statistics(ema.ema_model.module, model)
            self._swapped_for_val = True

    def after_val_epoch(self,
                        runner: Runner,
                        metrics: Optional[Dict[str, float]] = None) -> None:
        """Swap the BN statistics back."""
        if self._swapped_for_val:
            ema = self._ema_hook(runner)
            swap_bn_statistics(ema.ema_model.module,
                               unwrap_model(runner.model))
            self._swapped_for_val = False

    # -- helpers ---------------------------------------------------------
    def _due(self, on_interval: bool, is_last: bool) -> bool:
        return self._has_bn and (on_interval or (self.at_end and is_last))

    def _publish(self, runner: Runner, batch_idx: int) -> None:
        """Put pending values on the message hub for LoggerHook's line of
        this iteration (it runs after this hook); removed next iteration."""
        if self._schedule.logger is None:
            self.after_train(runner)
            return
        if not self._schedule.logs_after(runner, batch_idx):
            return
        for key, value in self._pending.items():  # once: never resumed
            runner.message_hub.update_scalar(key, value, resumed=False)
        self._published, self._pending = self._pending, {}

    @staticmethod
    def _ema_hook(runner: Runner) -> Optional[EMAHook]:
        """The runner's EMAHook once it holds its EMA model, or None."""
        return find_hook(runner, EMAHook, ready='ema_model')

    def _build_loader(self, runner: Runner) -> DataLoader:
        """The precise-BN loader: never the training loader itself."""
        if self.dataloader_cfg is None:
            return loader_like(runner.train_dataloader, runner.seed, OWNER)
        from mmengine.runner import Runner
        return loader_from_cfg(self.dataloader_cfg, runner.seed,
                               Runner.build_dataloader, OWNER)

    def _forward_context(self, runner: Runner,
                         model: torch.nn.Module) -> Optional[Callable]:
        """The optimizer wrapper's context (AMP autocast) for the
        recomputation's forwards, or None."""
        wrapper = runner.optim_wrapper
        if isinstance(wrapper, OptimWrapper):  # AmpOptimWrapper: autocast
            return lambda: wrapper.optim_context(model)
        return None

    def _recompute(self, runner: Runner, model: torch.nn.Module,
                   unwrapped: torch.nn.Module, what: str) -> dict:
        """Recompute ``model``'s statistics (the forwards in the optimizer
        wrapper's context for ``unwrapped``, the user's model); log it."""
        sampler = getattr(self._loader, 'sampler', None)
        if hasattr(sampler, 'set_epoch'):  # other samples at every run
            sampler.set_epoch(self._num_runs)
        summary = update_bn_stats(
            model,
            self._loader,
            num_samples=self.num_samples,
            estimator=self.estimator,
            forward_context=self._forward_context(runner, unwrapped),
            progress=self.progress)
        _log_summary(summary, what, first=self._num_runs == 0)
        return summary

    def _run(self, runner: Runner) -> None:
        """Recompute the model's BN statistics (the EMA model's later, when
        they are needed: before a validation or a checkpoint)."""
        model = unwrap_model(runner.model)
        names = layers_to_update(model)  # the modes of this moment
        if bool(names) != self._active:  # said once per change
            self._active = bool(names)
            _log_modes(names)
        if not names:
            return
        # the model as trained: update_bn_stats strips DDP, keeps sharding
        summary = self._recompute(runner, runner.model, model, 'model')
        if not summary['num_layers']:  # none was called in the forwards
            return
        self._pending[VAR_CHANGE] = summary['var_change']
        self._num_runs += 1
        self._ema_stale = (
            self.update_ema and not self._ema_sharded
            and self._ema_hook(runner) is not None)

    def _refresh_ema(self, runner: Runner, model: torch.nn.Module) -> None:
        """Recompute the EMA model's statistics if they are stale, under the
        modes of ``model`` (the unwrapped model)."""
        if not self._ema_stale:
            return
        self._ema_stale = False
        ema_model = self._ema_hook(runner).ema_model.module
        with mirror_modes(ema_model, model):  # its modes may differ
            summary = self._recompute(runner, ema_model, model, 'EMA model')
        if summary['num_layers']:
            self._pending[EMA_VAR_CHANGE] = summary['var_change']


def _drop_hub_keys(checkpoint: dict) -> None:
    """Keep the once-per-run values out of the checkpoint's message hub.

    They are published for one log line only, so a resume has nothing to
    restore; mmengine's ``MessageHub.load_state_dict`` warns about every
    key of ``resumed_keys`` it cannot find in ``log_scalars`` (``resumed
    key: ... is not defined in message_hub``), whatever its flag.
    """
    state = checkpoint.get('message_hub')
    if not isinstance(state, dict):
        return
    for part in ('resumed_keys', 'log_scalars'):
        table = state.get(part)
        if isinstance(table, dict):  # a new dict: never the live hub's
            state[part] = type(table)(
                (k, v) for k, v in table.items() if k not in HUB_KEYS)


def _log_modes(names: Optional[List[str]]) -> None:
    """Say that no BN layer is to be recomputed (``names`` None: at the
    start of training; empty: from now on) or that some are again."""
    if names is None:
        text = ('every BatchNorm layer stays in eval mode during training '
                '(e.g. norm_eval=True, frozen stages) or tracks no running '
                'statistics: nothing to recompute, nothing is published. '
                'Layers that return to training mode later in the run are '
                'recomputed from then on.')
    elif names:
        text = (f'{len(names)} BatchNorm layers are in training mode now: '
                'recomputing them from now on')
    else:
        text = ('every BatchNorm layer is in eval mode now: nothing to '
                'recompute, nothing is published until some return to '
                'training mode')
    print_log(f'PreciseBNHook: {text}', 'current', level=logging.WARNING)


def _log_summary(summary: dict, what: str, first: bool) -> None:
    """One line per recomputation (``what``: 'model' or 'EMA model'); on
    the ``first`` run of training, the layers left alone too."""
    if not summary['num_layers']:
        print_log(
            f'PreciseBN ({what}): no BN layer in training mode was called by '
            'the forwards (mode="tensor"): nothing updated, nothing '
            f'published; not called: {", ".join(summary["skipped"]) or "-"}',
            'current',
            level=logging.WARNING)
        return
    print_log(
        f'PreciseBN ({what}): updated {summary["num_layers"]} BN layers '
        f'with {summary["num_samples"]} samples in '
        f'{summary["seconds"]:.2f}s; running_var moved by '
        f'{100 * summary["var_change"]:.2f}% (mean relative change)',
        'current')
    if first:
        for key, text in (('frozen', 'left alone (eval mode)'),
                          ('skipped', 'not called in a forward: left alone'),
                          ('unaffected_norms', 'not BatchNorm: not affected')):
            if summary.get(key):
                print_log(f'PreciseBN: {text}: {", ".join(summary[key])}',
                          'current')
