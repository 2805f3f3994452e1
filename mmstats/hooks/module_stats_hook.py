# Copyright (c) mmstats contributors. All rights reserved.
"""ModuleStatsHook: per-module activation, gradient and update statistics
on the iterations that end a publication interval (``docs/module_stats.md``).
"""
import re
import time
from typing import Dict, List, Optional, Sequence, Union

import torch
from mmengine.dist import all_reduce
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.runner import Runner
from torch import nn

from mmstats.registry import HOOKS
from mmstats.sharding import ParamLayout, sum_squares
from mmstats.stats import report
from mmstats.utils.args import check_str
from .log_rhythm import (find_logger_hook, last_step_before_publication,
                         train_publication)
from .module_act import ActivationProbes, in_backward
from .module_steps import BEFORE, GRAD, UPDATE, StepProbe
from .stats_collector_hook import DEFAULT_INTERVAL, StatsCollectorHook
from .strategies import refuse_unchecked_strategy

DATA_BATCH = Optional[Union[dict, tuple, list]]
MODULE_STATS = ('act', 'grad_norm', 'weight_norm', 'update_ratio')


@HOOKS.register_module()
class ModuleStatsHook(Hook):
    """Report activation, gradient and update statistics of the modules
    whose names match ``modules``, on the iterations where the statistics
    are published.

    For every matching module (``re.fullmatch`` on the names of the model's
    ``named_modules()``, DDP unwrapped) it reports, through
    :func:`mmstats.report`:

    - ``<prefix>/<name>/act``: every element of the floating-point output
      tensor(s) of the module's forward (a checkpointed module's
      recomputation in the backward pass is not counted again);
    - ``<prefix>/<name>/grad_norm``: the L2 norm of the gradients of the
      module's parameters (recursively) that have one, right before the
      optimizer updates them (after DDP's / FSDP's reduction and AMP
      unscaling, before clipping);
    - ``<prefix>/<name>/weight_norm``: the L2 norm of its parameters at the
      end of the iteration;
    - ``<prefix>/<name>/update_ratio``: ``||w_after - w_before|| /
      ||w_before||`` over the parameters that have a gradient;
    - ``<prefix>/total_grad_norm`` (with ``grad_norm``): the L2 norm of the
      gradients of every parameter the optimizer updates, before clipping
      (``.<key>`` per optimizer of an ``OptimWrapperDict``);
    - ``<prefix>/amp_skipped_steps`` (with an ``AmpOptimWrapper``): how
      many optimizer steps the GradScaler skipped (non-finite gradients)
      since the previous publication;
    - ``<prefix>/instrument_ms``: the host time spent by the
      instrumentation on that iteration.

    Forward hooks and optimizer step hooks (one pair per optimizer, so an
    ``OptimWrapperDict`` works too) are registered once in ``before_train``,
    before mmengine's ``compile=True`` compiles ``train_step``, and are
    armed only on the iteration after which StatsCollectorHook publishes
    (the gradient side: on the last optimizer step up to it). Arming never
    recompiles a compiled ``train_step``. Frozen modules get no
    ``grad_norm``/``update_ratio``; a step the GradScaler skips gives none
    either. Under sharded training (FSDP1, FSDP2, DeepSpeed ZeRO-1/2/3) the
    norms are those of the full tensors: each rank's sums of squares of
    the parts it holds, SUM-reduced in one all_reduce per instrumented step
    (``docs/sharding.md``). See ``docs/module_stats.md`` (schedule, compile,
    AMP, checkpointing, cost).

    Args:
        modules (str): Regular expression matched (``re.fullmatch``) against
            the model's module names, e.g. ``r'backbone\\.layer\\d'``.
        stats (Sequence[str]): What to report, from ``MODULE_STATS``
            (activations cost the most: one reduction of every output
            element). Defaults to all of them.
        prefix (str): Prefix of the reported names. Defaults to 'modules'.

    Example:
        >>> custom_hooks = [
        ...     dict(type='mmstats.StatsCollectorHook'),
        ...     dict(type='mmstats.ModuleStatsHook',
        ...          modules=r'backbone\\.layer\\d|head',
        ...          stats=('act', 'grad_norm', 'update_ratio')),
        ... ]
        >>> hook = ModuleStatsHook(modules=r'backbone\\.layer\\d')
        >>> hook.stats
        ('act', 'grad_norm', 'weight_norm', 'update_ratio')
    """

    priority = 'ABOVE_NORMAL'  # report before StatsCollectorHook publishes

    def __init__(self,
                 modules: str,
                 stats: Sequence[str] = MODULE_STATS,
                 prefix: str = 'modules') -> None:
        if not isinstance(modules, str) or not modules:
            raise TypeError('ModuleStatsHook: modules must be a non-empty '
                            'regular expression (str) matched against the '
                            f"model's module names, got {modules!r}")
        try:
            self.pattern = re.compile(modules)
        except re.error as e:
            raise ValueError(f'ModuleStatsHook: modules={modules!r} is not a '
                             f'valid regular expression ({e})') from None
        what = (f'a non-empty list of {MODULE_STATS}, e.g. '
                'stats=("act", "grad_norm")')
        if isinstance(stats, str) or not isinstance(stats, Sequence):
            raise TypeError(f'ModuleStatsHook: stats must be {what}, got '
                            f'{stats!r} of type {type(stats).__name__}')
        if not stats or not set(stats) <= set(MODULE_STATS):
            raise ValueError(
                f'ModuleStatsHook: stats must be {what}, got {stats!r}')
        check_str('ModuleStatsHook', 'prefix', prefix, 'modules')
        self.modules = modules
        self.stats = tuple(stats)
        self.prefix = prefix
        # built in before_train
        self.targets: Dict[str, nn.Module] = {}
        self._collector_hook: Optional[StatsCollectorHook] = None
        self._logger = None
        self._interval = DEFAULT_INTERVAL
        self._acts: Optional[ActivationProbes] = None
        self._steps: List[StepProbe] = []
        self._totals: List[str] = []  # total_grad_norm name per probe
        self._layout: Optional[ParamLayout] = None
        self._weights: List[tuple] = []  # (segments, part) in the targets
        self._device = torch.device('cpu')
        self._publishes = False
        self._skipped = 0
        self._cost = 0.0

    # -- setup -----------------------------------------------------------
    def before_run(self, runner: Runner) -> None:
        """Refuse a strategy whose numbers were never checked."""
        refuse_unchecked_strategy(runner, 'ModuleStatsHook')

    def before_train(self, runner) -> None:
        self.remove()  # a second runner.train()
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self.targets = {
            name: module
            for name, module in model.named_modules()
            if name and self.pattern.fullmatch(name)
        }
        if not self.targets:
            names = [n for n, _ in model.named_modules() if n]
            shown = ', '.join(
                names[:12]) + (', ...' if len(names) > 12 else '')
            raise ValueError(
                f'ModuleStatsHook: modules={self.modules!r} matches no '
                f'module name of {type(model).__name__} (re.fullmatch); '
                f'its modules are: {shown}')
        self._collector_hook = next(
            (h for h in runner.hooks if isinstance(h, StatsCollectorHook)),
            None)
        self._logger = find_logger_hook(runner)
        if self._collector_hook is None:
            if self._logger is not None:
                self._interval = self._logger.interval
            print_log(
                'ModuleStatsHook: no StatsCollectorHook in custom_hooks: '
                'the statistics are reported but only a Collector of yours '
                'publishes them',
                'current',
                level=30)
        self._layout = ParamLayout(runner.model)
        owners = self._layout.owners(list(self.targets.values()))
        self._weights = [(tuple(segments), self._layout.parts[i])
                         for i, segments in owners.items()]
        self._device = next(model.parameters(), torch.zeros(0)).device
        if 'act' in self.stats:
            self._acts = ActivationProbes(self.targets, self.prefix)
            if not in_backward.available:
                print_log(
                    'ModuleStatsHook: this torch cannot tell a backward '
                    'pass: modules under activation checkpointing count '
                    'their outputs twice',
                    'current',
                    level=30)
        wrappers = (
            dict(runner.optim_wrapper.items()) if isinstance(
                runner.optim_wrapper, OptimWrapperDict) else {
                    '': runner.optim_wrapper
                })
        # segments: the targets, then one of every parameter (the total)
        total = len(self.targets)
        parts = [(tuple(owners.get(i, ())) + (total, ), part)
                 for i, part in enumerate(self._layout.parts)]
        self._steps, self._totals = [], []
        for key, wrapper in wrappers.items():
            if not isinstance(wrapper, OptimWrapper) and not _deepspeed(
                    wrapper, self.stats):
                continue
            self._steps.append(
                StepProbe(wrapper, parts, total + 1, self.stats, self._device))
            self._totals.append(f'{self.prefix}/total_grad_norm' +
                                (f'.{key}' if key else ''))
        for probe in self._steps:
            if probe.amp and getattr(probe.optim_wrapper.optimizer,
                                     '_step_supports_amp_scaling', False):
                print_log(
                    'ModuleStatsHook: a fused optimizer under a GradScaler '
                    'steps on scaled gradients: no grad_norm/update_ratio '
                    'and no amp_skipped_steps for '
                    f'{type(probe.optim_wrapper.optimizer).__name__}',
                    'current',
                    level=30)
                probe.stats, probe.amp = [], False
        for index in reversed(range(len(self._steps))):
            probe = self._steps[index]
            if not (probe.stats or probe.amp):
                probe.remove()  # nothing to take at its steps
                del self._steps[index], self._totals[index]

    # -- when ------------------------------------------------------------
    def publishes_after(self, runner, batch_idx: int) -> bool:
        """Whether the statistics are published after training iteration
        ``batch_idx``: StatsCollectorHook's rule (it owns it), or without
        one LoggerHook's lines."""
        if self._collector_hook is not None:
            return self._collector_hook.publishes_after(runner, batch_idx)
        return train_publication(runner, batch_idx, self._interval,
                                 self._logger)[0]

    def _steps_armed(self, runner, batch_idx: int,
                     optim_wrapper: OptimWrapper) -> bool:
        """Whether the gradient statistics are taken at this iteration's
        optimizer step: the last step up to a publication."""
        if getattr(optim_wrapper, '_accumulative_counts',
                   1) == 1:  # steps every time (DeepSpeed: at boundaries)
            return self._publishes
        return last_step_before_publication(runner, batch_idx, optim_wrapper,
                                            self.publishes_after)

    # -- instrumentation -------------------------------------------------
    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch: DATA_BATCH = None) -> None:
        start = time.perf_counter()
        self._publishes = self.publishes_after(runner, batch_idx)
        for probe in self._steps:
            probe.begin_iteration(
                self._steps_armed(runner, batch_idx, probe.optim_wrapper))
        if self._acts is not None:
            self._acts.armed = self._publishes
        if self._publishes or any(p.armed for p in self._steps):
            self._cost += time.perf_counter() - start

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        start = time.perf_counter()
        for probe in self._steps:
            self._skipped += probe.end_iteration()
            self._cost += probe.cost
            probe.cost = 0.0
        if self._acts is not None:
            self._acts.armed = False
            self._cost += self._acts.cost
            self._acts.cost = 0.0
        if not self._publishes:
            return
        self._report_norms()
        if any(p.amp for p in self._steps):
            report(f'{self.prefix}/amp_skipped_steps', float(self._skipped))
            self._skipped = 0
        self._cost += time.perf_counter() - start
        report(f'{self.prefix}/instrument_ms', self._cost * 1e3)
        self._cost = 0.0

    def after_train(self, runner) -> None:
        self.remove()

    def remove(self) -> None:
        """Remove every forward and optimizer step hook."""
        if self._acts is not None:
            self._acts.remove()
            self._acts = None
        for probe in self._steps:
            probe.remove()
        self._steps = []

    def _report_norms(self) -> None:
        """Report the norms of the full tensors: the local sums of squares
        of the armed steps and of the weights, SUM-reduced over the ranks
        in one collective when the model is sharded."""
        taken = [probe.take() for probe in self._steps]
        rows = [squares.flatten() for squares, _ in taken]
        if 'weight_norm' in self.stats and self._weights:
            rows.append(
                sum_squares([part.weight() for _, part in self._weights],
                            [segments for segments, _ in self._weights],
                            len(self.targets), self._device))
        if not rows:
            return
        payload = torch.cat(rows)
        if self._layout.sharded:
            all_reduce(payload, op='sum')  # every rank, same shape
        norms = payload.sqrt_()
        names = list(self.targets)
        size = 3 * (len(names) + 1)
        for index, (_, present) in enumerate(taken):
            squares = norms[index * size:(index + 1) * size].view(3, -1)
            for segment in present:
                if segment == len(names):
                    if 'grad_norm' in self.stats:
                        report(self._totals[index], squares[GRAD, segment])
                    continue
                key = f'{self.prefix}/{names[segment]}'
                if 'grad_norm' in self.stats:
                    report(f'{key}/grad_norm', squares[GRAD, segment])
                if 'update_ratio' in self.stats:
                    report(f'{key}/update_ratio',
                           squares[UPDATE, segment] / squares[BEFORE, segment])
        if 'weight_norm' in self.stats and self._weights:
            weights = norms[len(taken) * size:]
            for segment in sorted(
                {s
                 for segments, _ in self._weights
                 for s in segments}):
                report(f'{self.prefix}/{names[segment]}/weight_norm',
                       weights[segment])


def _deepspeed(wrapper, stats: Sequence[str]) -> bool:
    """Whether ``wrapper`` is mmengine's DeepSpeedOptimWrapper whose
    gradients the hook can read (unscaled: not under DeepSpeed's fp16
    loss scaling); warns where it cannot."""
    engine = getattr(wrapper, '_model', None)
    if type(wrapper).__name__ != 'DeepSpeedOptimWrapper' or engine is None:
        return False
    wanted = [s for s in stats if s in ('grad_norm', 'update_ratio')]
    if engine.fp16_enabled() and wanted:
        print_log(
            'ModuleStatsHook: DeepSpeed fp16 keeps gradients multiplied by '
            'its loss scale until engine.step(): no grad_norm, update_ratio '
            'or total_grad_norm (use bf16, or stats=("act", "weight_norm"))',
            'current',
            level=30)
        return False
    if engine.gradient_accumulation_steps() > 1 and wanted:
        print_log(
            'ModuleStatsHook: DeepSpeed gradient_accumulation_steps > 1: '
            'gradient statistics are taken only where a publication falls '
            'on an accumulation boundary',
            'current',
            level=30)
    return True
