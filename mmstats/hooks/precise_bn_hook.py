# Copyright (c) mmstats contributors. All rights reserved.
"""PreciseBNHook: a thin mmengine hook around :func:`update_bn_stats`."""
from typing import Optional, Union

import torch
from mmengine.dataset import DefaultSampler
from mmengine.hooks import EMAHook, Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper
from mmengine.runner import EpochBasedTrainLoop, Runner
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader

from mmstats.precise_bn import check_args, update_bn_stats
from mmstats.registry import HOOKS

DATA_BATCH = Optional[Union[dict, tuple, list]]


@HOOKS.register_module()
class PreciseBNHook(Hook):
    """Recompute BatchNorm population statistics with frozen weights.

    At the end of every ``interval`` epochs (or iterations), the BN layers'
    running mean/var are replaced by the exact statistics of ``num_samples``
    training samples under the current weights ("Rethinking 'Batch' in
    BatchNorm", Wu & Johnson 2021), reduced over all ranks so every rank
    holds identical statistics (mmengine's DDP wrapper does not broadcast
    buffers). The hook runs before CheckpointHook and EMAHook (priority
    ``ABOVE_NORMAL``), so validation and checkpoints see the new statistics.

    The training data stream is never touched: the hook reads the training
    *dataset* through a loader and sampler of its own (or the ``dataloader``
    given), never calls ``iter()`` on the training loader, and restores the
    global RNG state afterwards, so a run sees the same batches in the same
    order with or without this hook.

    With mmengine's ``EMAHook``, ``update_ema=True`` also recomputes the BN
    statistics of the EMA model for the EMA weights, just before they are
    used (validation or checkpoint). With ``EMAHook(update_buffers=False)``
    mmengine would validate EMA weights with the raw model's statistics; the
    hook swaps the EMA statistics into the model for the validation loop.

    Args:
        num_samples (int): Samples (over all ranks) used per recomputation.
            Defaults to 8192.
        interval (int): Run every ``interval`` epochs or iterations.
            Defaults to 1.
        by_epoch (bool, optional): True: every ``interval`` epochs; False:
            every ``interval`` iterations; None: follow the train loop
            (epochs for ``EpochBasedTrainLoop``). Defaults to None.
        at_end (bool): Also run after the last epoch/iteration when it is
            not on the interval. Defaults to True.
        estimator (str): ``'population'`` (the paper's estimator, weighted by
            each batch's value count) or ``'batch_average'`` (mmpretrain's
            equal-weight average of batch statistics). Defaults to
            ``'population'``.
        dataloader (dict, optional): Config of a separate loader for the
            precise-BN data (built with ``Runner.build_dataloader``). None
            reads the training dataset with a shuffled ``DefaultSampler`` of
            the training batch size. Defaults to None.
        update_ema (bool): Also recompute the EMA model's statistics when an
            ``EMAHook`` is registered. Defaults to True.
        progress (bool): Show a progress bar on rank 0. Defaults to True.
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
        check_args(num_samples, estimator, owner='PreciseBNHook')
        if not isinstance(interval, int) or isinstance(
                interval, bool) or interval <= 0:
            raise ValueError('PreciseBNHook: interval must be a positive int, '
                             f'got {interval!r}')
        if by_epoch not in (None, True, False):
            raise ValueError('PreciseBNHook: by_epoch must be None (follow '
                             'the train loop), True or False, got '
                             f'{by_epoch!r}')
        if dataloader is not None and not isinstance(dataloader, dict):
            raise TypeError('PreciseBNHook: dataloader must be None or a '
                            'dataloader config dict, got '
                            f'{type(dataloader).__name__}')
        for name, flag in (('at_end', at_end), ('update_ema', update_ema),
                           ('progress', progress)):
            if not isinstance(flag, bool):
                raise TypeError(f'PreciseBNHook: {name} must be a bool, got '
                                f'{flag!r}')
        self.num_samples = num_samples
        self.interval = interval
        self._by_epoch = by_epoch
        self.by_epoch = by_epoch
        self.at_end = at_end
        self.estimator = estimator
        self.dataloader_cfg = dataloader
        self.update_ema = update_ema
        self.progress = progress
        self._loader: Optional[DataLoader] = None
        self._num_runs = 0
        self._ema_stale = False
        self._swapped_for_val = False

    # -- hook points -----------------------------------------------------
    def before_train(self, runner) -> None:
        if self._by_epoch is None:
            self.by_epoch = isinstance(runner.train_loop, EpochBasedTrainLoop)
        if not any(isinstance(m, _BatchNorm) for m in runner.model.modules()):
            print_log('PreciseBNHook: the model has no BatchNorm layer; the '
                      'hook does nothing.', 'current', level=30)
            self.interval = 0

    def after_train_epoch(self, runner) -> None:
        if self.by_epoch and self._due(
                self.every_n_epochs(runner, self.interval),
                self.is_last_train_epoch(runner)):
            self._run(runner)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        if not self.by_epoch and self._due(
                self.every_n_train_iters(runner, self.interval),
                self.is_last_train_iter(runner)):
            self._run(runner)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self._refresh_ema(runner)

    def before_val_epoch(self, runner) -> None:
        self._refresh_ema(runner)
        ema = self._ema_hook(runner)
        if ema is not None and not ema.ema_model.update_buffers:
            # mmengine swaps parameters only: bring the EMA statistics too
            self._swap_bn_buffers(ema.ema_model.module, self._bare(runner))
            self._swapped_for_val = True

    def after_val_epoch(self, runner, metrics=None) -> None:
        if self._swapped_for_val:
            ema = self._ema_hook(runner)
            self._swap_bn_buffers(ema.ema_model.module, self._bare(runner))
            self._swapped_for_val = False

    # -- helpers ---------------------------------------------------------
    def _due(self, on_interval: bool, is_last: bool) -> bool:
        if self.interval == 0:
            return False
        return on_interval or (self.at_end and is_last)

    @staticmethod
    def _bare(runner) -> torch.nn.Module:
        model = runner.model
        return model.module if is_model_wrapper(model) else model

    @staticmethod
    def _ema_hook(runner) -> Optional[EMAHook]:
        for hook in runner.hooks:
            if isinstance(hook, EMAHook) and hasattr(hook, 'ema_model'):
                return hook
        return None

    @staticmethod
    def _swap_bn_buffers(a: torch.nn.Module, b: torch.nn.Module) -> None:
        """Exchange the running stats of two models of the same structure."""
        for ma, mb in zip(a.modules(), b.modules()):
            if isinstance(ma, _BatchNorm) and ma.track_running_stats:
                for name in ('running_mean', 'running_var'):
                    buf_a, buf_b = getattr(ma, name), getattr(mb, name)
                    tmp = buf_a.clone()
                    buf_a.copy_(buf_b)
                    buf_b.copy_(tmp)

    def _build_loader(self, runner) -> DataLoader:
        """The precise-BN loader: never the training loader itself."""
        if self.dataloader_cfg is not None:
            return Runner.build_dataloader(
                self.dataloader_cfg, seed=runner.seed)
        train_loader = runner.train_dataloader
        batch_size = train_loader.batch_size or getattr(
            train_loader.batch_sampler, 'batch_size', None)
        if batch_size is None:
            raise ValueError(
                'PreciseBNHook cannot tell the batch size of the training '
                'loader (it has neither batch_size nor batch_sampler.'
                'batch_size): pass dataloader=dict(...) to the hook')
        dataset = train_loader.dataset
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=DefaultSampler(dataset, shuffle=True, seed=runner.seed),
            num_workers=train_loader.num_workers,
            collate_fn=train_loader.collate_fn,
            pin_memory=train_loader.pin_memory,
            worker_init_fn=train_loader.worker_init_fn,
            drop_last=False)

    def _forward_context(self, runner, model):
        wrapper = runner.optim_wrapper
        if isinstance(wrapper, OptimWrapper):  # AmpOptimWrapper: autocast
            return lambda: wrapper.optim_context(model)
        return None

    def _recompute(self, runner, model: torch.nn.Module, what: str) -> dict:
        if self._loader is None:
            self._loader = self._build_loader(runner)
        sampler = getattr(self._loader, 'sampler', None)
        if hasattr(sampler, 'set_epoch'):  # other samples at every run
            sampler.set_epoch(self._num_runs)
        summary = update_bn_stats(
            model,
            self._loader,
            num_samples=self.num_samples,
            estimator=self.estimator,
            forward_context=self._forward_context(runner, model),
            progress=self.progress)
        print_log(
            f'PreciseBN ({what}): updated {summary["num_layers"]} BN layers '
            f'with {summary["num_samples"]} samples in '
            f'{summary["seconds"]:.2f}s; running_var moved by '
            f'{100 * summary["var_change"]:.2f}% (mean relative change)',
            'current')
        if self._num_runs == 0:
            for key, text in (('frozen', 'left alone (eval mode)'),
                              ('skipped', 'not called in a forward: left '
                               'alone'),
                              ('unaffected_norms', 'not BatchNorm: not '
                               'affected')):
                if summary.get(key):
                    print_log(f'PreciseBN: {text}: {", ".join(summary[key])}',
                              'current')
        return summary

    def _run(self, runner) -> None:
        summary = self._recompute(runner, self._bare(runner), 'model')
        runner.message_hub.update_scalar('train/precise_bn/var_change',
                                         summary['var_change'])
        self._num_runs += 1
        self._ema_stale = (
            self.update_ema and self._ema_hook(runner) is not None)

    def _refresh_ema(self, runner) -> None:
        """Recompute the EMA model's statistics if they are stale."""
        if not self._ema_stale:
            return
        self._ema_stale = False
        ema_model = self._ema_hook(runner).ema_model.module
        # the EMA copy's train/eval flags may differ: mirror the model's
        flags = [m.training for m in ema_model.modules()]
        for ema_m, m in zip(ema_model.modules(), self._bare(runner).modules()):
            ema_m.training = m.training
        try:
            summary = self._recompute(runner, ema_model, 'EMA model')
        finally:
            for m, flag in zip(ema_model.modules(), flags):
                m.training = flag
        runner.message_hub.update_scalar('train/precise_bn/ema_var_change',
                                         summary['var_change'])
