# Copyright (c) mmstats contributors. All rights reserved.
"""ModuleStatsHook: per-module activation, gradient and update statistics
on the iterations that end a publication interval (``docs/module_stats.md``).
"""
import re
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper, OptimWrapperDict
from torch import nn

from mmstats.registry import HOOKS
from mmstats.stats import report
from .log_rhythm import (find_logger_hook, last_step_before_publication,
                         train_publication)
from .module_tensors import SegmentNorms, amp_grad_scale, floating_tensors
from .stats_collector_hook import DEFAULT_INTERVAL, StatsCollectorHook

DATA_BATCH = Optional[Union[dict, tuple, list]]
Params = List[torch.Tensor]
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
      tensor(s) of the module's forward;
    - ``<prefix>/<name>/grad_norm``: the L2 norm of the gradients of the
      module's parameters (recursively) that have one, when the optimizer
      steps (after DDP's reduction and AMP unscaling, before the step);
    - ``<prefix>/<name>/weight_norm``: the L2 norm of its parameters after
      the step;
    - ``<prefix>/<name>/update_ratio``: ``||w_after - w_before|| /
      ||w_before||`` over the parameters that have a gradient;
    - ``<prefix>/instrument_ms``: the host time spent by the
      instrumentation on that iteration.

    Forward hooks and a wrapped optimizer ``step`` are attached only on the
    iteration after which StatsCollectorHook publishes (with gradient
    accumulation: the last optimizer step up to it) and removed afterwards.
    Frozen modules get no ``grad_norm``/``update_ratio``. See
    ``docs/module_stats.md`` (schedule, AMP, cost).

    Args:
        modules (str): Regular expression matched (``re.fullmatch``) against
            the model's module names, e.g. ``r'backbone\\.layer\\d'``.
        stats (Sequence[str]): What to report, from ``MODULE_STATS``
            (activations cost the most: one reduction of every output
            element). Defaults to all of them.
        prefix (str): Prefix of the reported names. Defaults to 'modules'.
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
        if isinstance(stats, str) or not isinstance(
                stats,
                Sequence) or not stats or not set(stats) <= set(MODULE_STATS):
            raise ValueError(f'ModuleStatsHook: stats must be a non-empty '
                             f'list of {MODULE_STATS}, e.g. stats=("act",), '
                             f'got {stats!r}')
        if not isinstance(prefix, str) or not prefix:
            raise ValueError('ModuleStatsHook: prefix must be a non-empty '
                             f'str, got {prefix!r}')
        self.modules = modules
        self.stats = tuple(stats)
        self.prefix = prefix
        self.targets = {}
        self._collector_hook: Optional[StatsCollectorHook] = None
        self._logger = None
        self._interval = DEFAULT_INTERVAL
        self._handles: list = []
        self._patched: List[Tuple[OptimWrapper, Optional[Callable]]] = []
        self._cost = 0.0
        self._instrumented = False

    @property
    def targets(self) -> Dict[str, nn.Module]:
        """The matched modules by name (set in ``before_train``)."""
        return self._targets

    @targets.setter
    def targets(self, targets: Dict[str, nn.Module]) -> None:
        self._targets = targets
        # segments [0, M): weights or gradients, [M, 2M): updates,
        # [2M, 3M): weights before the step (M modules)
        self._norms = SegmentNorms(3 * len(targets))
        # (module index, parameter) of every target, recursively
        self._owned_params: List[Tuple[int, nn.Parameter]] = [
            (index, param) for index, module in enumerate(targets.values())
            for param in module.parameters()
        ]

    # -- setup -----------------------------------------------------------
    def before_train(self, runner) -> None:
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
        if self._collector_hook is not None:
            self._interval = self._collector_hook.interval
        elif self._logger is not None:
            self._interval = self._logger.interval
        if self._collector_hook is None:
            print_log(
                'ModuleStatsHook: no StatsCollectorHook in custom_hooks: '
                'the statistics are reported but only a Collector of yours '
                'publishes them',
                'current',
                level=30)
        if isinstance(runner.optim_wrapper, OptimWrapperDict):
            print_log(
                'ModuleStatsHook: several optimizers (OptimWrapperDict): '
                'only activations are reported',
                'current',
                level=30)

    # -- when ------------------------------------------------------------
    def publishes_after(self, runner, batch_idx: int) -> bool:
        """Whether the statistics are published after iteration
        ``batch_idx`` (StatsCollectorHook's rule: where LoggerHook writes a
        line, every ``interval`` iterations, at the end of every epoch)."""
        collector = self._collector_hook
        if collector is not None:
            return collector.publishes_after(runner, batch_idx)
        return train_publication(runner, batch_idx, self._interval,
                                 self._logger)[0]

    # -- instrumentation -------------------------------------------------
    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch: DATA_BATCH = None) -> None:
        start = time.perf_counter()
        publishes = self.publishes_after(runner, batch_idx)
        optim_wrapper = runner.optim_wrapper
        if self.stats != ('act', ) and isinstance(optim_wrapper, OptimWrapper):
            if optim_wrapper._accumulative_counts == 1:  # steps every time
                steps = publishes
            else:
                steps = last_step_before_publication(runner, batch_idx,
                                                     optim_wrapper,
                                                     self.publishes_after)
            if steps:
                self._patch_step(optim_wrapper)
        if publishes and 'act' in self.stats:
            self._attach_forward_hooks()
        self._instrumented = bool(self._handles or self._patched)
        if self._instrumented:
            self._cost = time.perf_counter() - start

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        if not self._instrumented:
            return
        start = time.perf_counter()
        self.remove()
        self._instrumented = False
        self._cost += time.perf_counter() - start
        report(f'{self.prefix}/instrument_ms', self._cost * 1e3)

    def after_train(self, runner) -> None:
        self.remove()

    def remove(self) -> None:
        """Detach every forward hook and restore every wrapped ``step``."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for optim_wrapper, own_step in self._patched:
            if own_step is None:
                del optim_wrapper.step  # the class's step shows again
            else:
                optim_wrapper.step = own_step
        self._patched.clear()

    def _attach_forward_hooks(self) -> None:
        for name, module in self.targets.items():
            key = f'{self.prefix}/{name}/act'
            self._handles.append(
                module.register_forward_hook(self._make_forward_hook(key)))

    def _make_forward_hook(self, key: str):

        def forward_hook(module, args, output) -> None:
            start = time.perf_counter()
            for tensor in floating_tensors(output):
                report(key, tensor.detach())
            self._cost += time.perf_counter() - start

        return forward_hook

    def _patch_step(self, optim_wrapper: OptimWrapper) -> None:
        """Wrap ``optim_wrapper.step`` (an instance attribute, deleted by
        :meth:`remove`) with the gradient and update statistics."""
        original = optim_wrapper.step
        own_step = vars(optim_wrapper).get('step')  # an instance patch

        def step(**kwargs) -> None:
            start = time.perf_counter()
            before = self._report_grads(optim_wrapper)
            self._cost += time.perf_counter() - start
            original(**kwargs)
            start = time.perf_counter()
            self._report_updates(*before)
            self._cost += time.perf_counter() - start

        optim_wrapper.step = step
        self._patched.append((optim_wrapper, own_step))

    def _report_grads(self, optim_wrapper: OptimWrapper) -> tuple:
        """Report the gradient norms of all modules in a few batched ops;
        return what :meth:`_report_updates` needs: ``(params with a
        gradient, their copies before the step, their owners)``."""
        params, owners = [], []
        for index, param in self._owned_params:
            if param.grad is not None:
                params.append(param)
                owners.append(index)
        if not params:  # every module frozen (or unused)
            return [], [], []
        if 'grad_norm' in self.stats:
            norms = self._norms([p.grad for p in params], owners)
            scale = amp_grad_scale(optim_wrapper)
            if scale is not None:
                norms = norms / scale.double()
            self._report_per_module('grad_norm', norms, owners)
        if 'update_ratio' not in self.stats:
            return [], [], []
        params = [p.detach() for p in params]
        return params, torch._foreach_mul(params, 1.0), owners  # copies

    def _report_updates(self, params: Params, old: Params,
                        owners: List[int]) -> None:
        """Weight norms and update ratios in one batched norm: segments
        ``[0, M)`` weights after the step, ``[M, 2M)`` the updates,
        ``[2M, 3M)`` the weights before (``M`` modules)."""
        tensors: Params = []
        segments: List[int] = []
        every_owner = [index for index, _ in self._owned_params]
        if 'weight_norm' in self.stats:
            tensors += [p.detach() for _, p in self._owned_params]
            segments += every_owner
        if params:
            num = len(self.targets)
            tensors += torch._foreach_sub(params, old) + old
            segments += [num + o
                         for o in owners] + [2 * num + o for o in owners]
        if not tensors:
            return
        norms = self._norms(tensors, segments).view(3, -1)
        if 'weight_norm' in self.stats:
            self._report_per_module('weight_norm', norms[0], every_owner)
        if params:
            self._report_per_module('update_ratio', norms[1] / norms[2],
                                    owners)

    def _report_per_module(self, stat: str, values: torch.Tensor,
                           owners: List[int]) -> None:
        """Report ``values[i]`` for every module ``i`` in ``owners``."""
        names = list(self.targets)
        for index in sorted(set(owners)):
            report(f'{self.prefix}/{names[index]}/{stat}', values[index])
