# Copyright (c) mmstats contributors. All rights reserved.
"""ModuleStatsHook: per-module activation, gradient and update statistics
on the iterations that end a publication interval (``docs/module_stats.md``).

Its parts, in this file:

**Activation probes** (:class:`ActivationProbes`): forward hooks registered
once, before ``torch.compile`` traces the model, and switched at run time.

torch.compile ignores module hooks added after the first compilation
(``skip_nnmodule_hook_guards``), so the hooks cannot come and go with the
instrumented iterations. They are registered in ``before_train`` and stay:

- eagerly, a hook reads :attr:`ActivationProbes.armed` (a Python bool) and
  returns at once when it is off;
- while dynamo traces, a hook puts one side-effectful custom op per output
  tensor into the graph, ``mmstats::module_act(Tensor value, int probes,
  str name) -> ()``; its kernel (eager Python, run where the graph runs)
  reads the flag. Dynamo guards on nothing of mmstats: arming never
  recompiles.

The recomputation of ``torch.utils.checkpoint`` (both variants) runs the
forward again inside the backward pass: those outputs are not recorded
(:func:`in_backward`), so every output element counts once.
See ``docs/module_stats.md``.

**Step probes** (:class:`StepProbe`): sums of squares of gradients and
updates, taken from torch's optimizer step hooks, one probe per optimizer.

``Optimizer.register_step_pre_hook`` runs right before the parameters are
updated: after DDP's / FSDP's reduction and, under a ``GradScaler``, after
``unscale_`` (``GradScaler.step`` unscales, then calls ``optimizer.step``
only if every gradient is finite). A step the scaler skips calls neither
hook, so its gradients never reach the statistics; it is counted instead.
Gradients are read *before clipping*: where the wrapper clips
(``clip_grad``), at its ``_clip_grad`` (gradients already unscaled), and
kept only if the step then happens. DeepSpeed's ZeRO optimizers have no
step hooks: for a ``DeepSpeedOptimWrapper`` the probe wraps its ``step``
(the engine's gradients are reduced, partitioned and unclipped until
``engine.step()``), at gradient accumulation boundaries.

The probe keeps per-segment sums of squares of the *local* parts of the
parameters (:mod:`mmstats.sharding`); ModuleStatsHook reduces them over the
ranks (sharded models) and reports the norms. The hooks are registered once
in ``before_train`` and run eagerly even inside a compiled ``train_step``
(``torch.compiler.disable``: dynamo breaks the graph there and guards on
nothing of them).
"""
from __future__ import annotations
import difflib
import functools
import itertools
import math
import time
import weakref
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional,
                    Sequence, Tuple, Union)

import torch
from mmengine.dist import all_reduce
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper, OptimWrapperDict
from torch import Tensor, nn
from torch.fx.node import has_side_effect

from mmstats.registry import HOOKS
from mmstats.sharding import (ParamLayout, ParamPart, segment_sum, sum_squares,
                              unwrap_model)
from mmstats.stats import report
from mmstats.stats.nonfinite import NonfiniteWatch
from mmstats.utils.args import (check_bool, check_keywords, check_names,
                                check_str, compile_regex,
                                refuse_second_instance, unmatched_alternatives)
from .schedule import PublicationSchedule, find_hook
from .stats_collector_hook import StatsCollectorHook
from .strategies import refuse_unchecked_strategy

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = [
    'ModuleStatsHook', 'MODULE_STATS', 'ActivationProbes', 'StepProbe',
    'in_backward', 'floating_tensors', 'FIRST_MOMENTS', 'SECOND_MOMENTS'
]

DATA_BATCH = Optional[Union[dict, tuple, list]]
OWNER = 'ModuleStatsHook'
MODULE_STATS = ('act', 'grad_norm', 'weight_norm', 'update_ratio')
#: optimizer states read with ``optimizer_state=True``
FIRST_MOMENTS = ('exp_avg', 'momentum_buffer')  # norm, cosine with the grad
SECOND_MOMENTS = ('exp_avg_sq', )  # sqrt of the sum: ||sqrt(v)||


@HOOKS.register_module()
@check_keywords
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
      instrumentation on that iteration;
    - with ``optimizer_state=True``, right after the optimizer step, over
      the module's parameters that had a gradient and keep the state:
      ``<prefix>/<name>/exp_avg_norm`` (``||m||``) and
      ``<prefix>/<name>/exp_avg_cos`` (``cos(grad, m)``) of Adam-like
      optimizers, ``<prefix>/<name>/exp_avg_sq_sqrt_norm``
      (``||sqrt(v)|| = sqrt(sum(v))``), and for SGD with momentum
      ``<prefix>/<name>/momentum_buffer_norm`` and
      ``<prefix>/<name>/momentum_buffer_cos``. A state the optimizer does
      not keep gives no name (``docs/optimizer_state.md``).

    Forward hooks and optimizer step hooks (one pair per optimizer, so an
    ``OptimWrapperDict`` works too) are registered once in ``before_train``,
    before mmengine's ``compile=True`` compiles ``train_step``, and are
    armed only on the iteration after which StatsCollectorHook publishes
    (the gradient side: on the last optimizer step up to it). Arming never
    recompiles a compiled ``train_step``. Frozen modules get no
    ``grad_norm``/``update_ratio``; a step the GradScaler skips gives none
    either. A module whose forward hooks see no output on a publication
    iteration (called as ``module.forward(x)``, as mmseg's decode heads
    are in ``loss()``, or never called) gets no ``act`` there: warned once
    per module. Under sharded training (FSDP1, FSDP2, DeepSpeed ZeRO-1/2/3) the
    norms are those of the full tensors: each rank's sums of squares of
    the parts it holds, SUM-reduced in one all_reduce per instrumented step
    (``docs/sharding.md``). See ``docs/module_stats.md`` (schedule, compile,
    AMP, checkpointing, cost).

    Mistakes get the fix: a misspelt argument names the closest one
    (``modules_regex=``: "did you mean modules?"); a second ModuleStatsHook
    in the same run is refused at ``before_run``, naming both; ``modules``
    matching no module name is refused at ``before_train``, and a top-level
    ``|``-alternative of it that matches none while others do is warned
    about once, with the model's names closest to it. Under
    ``DeepSpeedStrategy`` the hook wraps the optimizer wrapper's ``step``
    keeping the mark mmengine's parameter schedulers check
    (``_with_counter``): no scheduler warning comes from it.

    Args:
        modules (str): Regular expression matched (``re.fullmatch``) against
            the model's module names, e.g. ``r'backbone\\.layer\\d'``.
        stats (Sequence[str]): What to report, from ``MODULE_STATS``
            (activations cost the most: one reduction of every output
            element). Defaults to all of them.
        prefix (str): Prefix of the reported names. Defaults to 'modules'.
        optimizer_state (bool): Also report the norms of the optimizer's
            first and second moments and the cosine between gradient and
            first moment, read after the step. Defaults to False.
        watch_nonfinite (bool): Check every iteration (not only the
            instrumented ones) which matched module first produced a
            NaN/inf output or gradient: flags accumulate on the device and
            are read only when a publication finds non-finite values
            (``docs/nonfinite.md``). Defaults to False.

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
                 prefix: str = 'modules',
                 optimizer_state: bool = False,
                 watch_nonfinite: bool = False) -> None:
        check_str(OWNER, 'modules', modules, r'backbone\.layer\d')
        self.pattern = compile_regex(
            OWNER,
            'modules',
            modules,
            hint='; give modules= a valid regular expression matched '
            "(re.fullmatch) against the model's module names")
        self.stats = check_names(
            OWNER, 'stats', stats, MODULE_STATS.__contains__,
            f'a non-empty list of {MODULE_STATS}, e.g. '
            'stats=("act", "grad_norm")')
        check_str(OWNER, 'prefix', prefix, 'modules')
        self.optimizer_state = check_bool(OWNER, 'optimizer_state',
                                          optimizer_state)
        self.watch_nonfinite = check_bool(OWNER, 'watch_nonfinite',
                                          watch_nonfinite)
        self.modules = modules
        self.prefix = prefix
        # built in before_train
        self.targets: Dict[str, nn.Module] = {}
        self._collector_hook: Optional[StatsCollectorHook] = None
        # the rule without a StatsCollectorHook
        self._schedule: Optional[PublicationSchedule] = None
        self._acts: Optional[ActivationProbes] = None
        self._watch: Optional[NonfiniteWatch] = None
        self._watched = False  # the watch saw this iteration
        self._reset_watch = False  # a publication was checked: new interval
        self._steps: List[StepProbe] = []
        self._totals: List[str] = []  # total_grad_norm name per probe
        self._layout: Optional[ParamLayout] = None
        self._weights: List[tuple] = []  # (segments, part) in the targets
        self._device = torch.device('cpu')
        self._warned_unmatched = False
        self._warned_unseen: set = set()  # modules whose act never came
        self._publishes = False
        self._skipped = 0
        self._cost = 0.0

    # -- setup -----------------------------------------------------------
    def before_run(self, runner: Runner) -> None:
        """Refuse a strategy whose numbers were never checked (and
        ``optimizer_state`` under DeepSpeed); take the publication rule:
        StatsCollectorHook's, or without one LoggerHook's lines."""
        refuse_unchecked_strategy(runner, OWNER)
        if self.optimizer_state and type(getattr(
                runner, 'strategy', None)).__name__ == 'DeepSpeedStrategy':
            raise RuntimeError(
                'ModuleStatsHook: optimizer_state=True is not supported '
                "under DeepSpeedStrategy (DeepSpeed keeps the optimizer's "
                'state in its own partitions, which mmstats does not read); '
                'set optimizer_state=False')
        refuse_second_instance(OWNER, runner.hooks, ModuleStatsHook)
        self._collector_hook = find_hook(runner, StatsCollectorHook)
        self._schedule = None
        if self._collector_hook is None:
            # LoggerHook's lines: no publication of its own at the end
            self._schedule = PublicationSchedule(runner, at_last_iter=False)

    def before_train(self, runner: Runner) -> None:
        """Find the target modules; register the
        forward and optimizer step hooks (before ``compile=True`` compiles
        ``train_step``), disarmed."""
        self.remove()  # a second runner.train()
        self._warned_unseen = set()
        model = unwrap_model(runner.model)
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
        self._warn_unmatched(model)
        if self._collector_hook is None:
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
        self._watch = NonfiniteWatch(list(self.targets), self._device)
        if 'act' in self.stats or self.watch_nonfinite:
            self._acts = ActivationProbes(
                self.targets,
                self.prefix,
                watch=self._watch,
                report_acts='act' in self.stats)
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
                StepProbe(wrapper, parts, total + 1, self.stats, self._device,
                          self.optimizer_state, self._watch))
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
        for probe in self._steps:
            if probe.optimizer_state and (probe.engine is not None
                                          or any(part.state is None
                                                 for _, part in probe.parts)):
                print_log(
                    'ModuleStatsHook: DeepSpeed keeps the optimizer state in '
                    'its own partitions: no optimizer_state statistics for '
                    f'{type(probe.optim_wrapper.optimizer).__name__}',
                    'current',
                    level=30)
                probe.optimizer_state = False
        for index in reversed(range(len(self._steps))):
            probe = self._steps[index]
            if not (probe.stats or probe.amp or probe.optimizer_state
                    or self.watch_nonfinite):
                probe.remove()  # nothing to take at its steps
                del self._steps[index], self._totals[index]

    def _warn_unmatched(self, model: nn.Module) -> None:
        """Warn (once per hook) about each top-level ``|``-alternative of
        ``modules`` that matches no module name, with the model's names
        closest to it."""
        if self._warned_unmatched:
            return
        names = [n for n, _ in model.named_modules() if n]
        unmatched = unmatched_alternatives(self.modules, names)
        if not unmatched:
            return
        self._warned_unmatched = True
        closest = []
        for part in unmatched:  # the names most like it, backslashes out
            near = difflib.get_close_matches(
                part.replace('\\', ''), names, n=5, cutoff=0)
            closest.append(f'{part!r}: {", ".join(near)}')
        many = len(unmatched) > 1
        found = list(self.targets)
        print_log(
            f'ModuleStatsHook: modules={self.modules!r}: the alternative'
            f'{"s" * many} {", ".join(repr(p) for p in unmatched)} match'
            f'{"" if many else "es"} no module name of '
            f'{type(model).__name__} (re.fullmatch), so only '
            f'{", ".join(found[:5])}{" ..." * (len(found) > 5)} '
            f'{"are" if len(found) > 1 else "is"} instrumented; the module '
            f'names closest to {"; to ".join(closest)}',
            'current',
            level=30)

    def _warn_unseen(self, runner: Runner) -> None:
        """Warn, once per module and run, about the modules whose forward
        hooks saw no output on a publication iteration: their ``act`` is
        missing from it, and hooks cannot see why."""
        acts = self._acts
        if acts is None or not acts.report_acts:
            return
        unseen = [
            name for name in self.targets
            if f'{self.prefix}/{name}/act' not in acts.seen
            and name not in self._warned_unseen
        ]
        if not unseen:
            return
        self._warned_unseen.update(unseen)
        its, was = (('its', 'it was') if len(unseen) == 1 else
                    ('their', 'they were'))
        print_log(
            'ModuleStatsHook: no floating-point output of '
            f'{", ".join(unseen)} was seen on training iteration '
            f'{runner.iter + 1}, a publication, so {its} act is missing '
            f'there: {was} not called in that iteration, called as '
            "module.forward(...) (mmseg's decode heads in loss()) or never "
            'called (a ModuleList), none of which forward hooks see; '
            'instrument submodules that are called as module(...) instead, '
            r"e.g. modules=r'decode_head\.(bottleneck|conv_seg)'. Said once "
            'per module.',
            'current',
            level=30)

    # -- when ------------------------------------------------------------
    def publishes_after(self, runner: Runner, batch_idx: int) -> bool:
        """Whether the statistics are published after training iteration
        ``batch_idx``: StatsCollectorHook's rule (it owns it), or without
        one LoggerHook's lines."""
        if self._collector_hook is not None:
            return self._collector_hook.publishes_after(runner, batch_idx)
        return self._schedule.publishes_after(runner, batch_idx)

    def _steps_armed(self, runner: Runner, batch_idx: int,
                     optim_wrapper: OptimWrapper) -> bool:
        """Whether the gradient statistics are taken at this iteration's
        optimizer step: the last step up to a publication."""
        if getattr(optim_wrapper, '_accumulative_counts',
                   1) == 1:  # steps every time (DeepSpeed: at boundaries)
            return self._publishes
        return _last_step_before_publication(runner, batch_idx, optim_wrapper,
                                             self.publishes_after)

    # -- instrumentation -------------------------------------------------
    def before_train_iter(self,
                          runner: Runner,
                          batch_idx: int,
                          data_batch: DATA_BATCH = None) -> None:
        """Arm the probes on an iteration the statistics are published
        after (the step probes: on the last optimizer step up to it)."""
        start = time.perf_counter()
        if self._reset_watch:  # the previous publication was checked
            self._watch.reset()
            self._reset_watch = False
        self._publishes = self.publishes_after(runner, batch_idx)
        for probe in self._steps:
            probe.begin_iteration(
                self._steps_armed(runner, batch_idx, probe.optim_wrapper),
                self.watch_nonfinite)
        if self._acts is not None:
            self._acts.armed = self._publishes
            self._acts.seen.clear()
            self._acts.watching = self.watch_nonfinite
        self._watched = self.watch_nonfinite or self._publishes or any(
            p.armed for p in self._steps)
        if self._watched:
            self._watch.begin_iteration(runner.iter + 1)
        if self._publishes or any(p.armed for p in self._steps):
            self._cost += time.perf_counter() - start

    def after_train_iter(self,
                         runner: Runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """Disarm; on a publishing iteration report the norms, the skipped
        AMP steps and the instrumentation's cost."""
        start = time.perf_counter()
        for probe in self._steps:
            self._skipped += probe.end_iteration()
            self._cost += probe.cost
            probe.cost = 0.0
        if self._acts is not None:
            self._acts.armed = False
            self._cost += self._acts.cost
            self._acts.cost = 0.0
        if self._watched:
            self._watch.end_iteration()
        if not self._publishes:
            return
        self._reset_watch = True
        self._warn_unseen(runner)
        self._report_norms()
        if any(p.amp for p in self._steps):
            report(f'{self.prefix}/amp_skipped_steps', float(self._skipped))
            self._skipped = 0
        self._cost += time.perf_counter() - start
        report(f'{self.prefix}/instrument_ms', self._cost * 1e3)
        self._cost = 0.0

    def after_train(self, runner: Runner) -> None:
        """Remove every forward and optimizer step hook."""
        self.remove()

    def nonfinite_origin(self) -> List[dict]:
        """What this rank's watch saw since the previous publication: the
        first non-finite module output (forward order) and gradient
        (backward order), each ``(iteration, position, module)`` or None.
        Called by StatsCollectorHook on every rank when the reduced
        statistics found NaN/inf values; reads device flags (a host sync).
        """
        if self._watch is None:
            return []
        return [dict(self._watch.take(), every_iteration=self.watch_nonfinite)]

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
        moments = [
            probe.take_moments() for probe in self._steps
            if probe.optimizer_state
        ]
        rows += [sums.flatten() for sums in moments]
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
        names = list(self.targets)
        size = 3 * (len(names) + 1)
        if moments:
            start = len(taken) * size
            stop = start + len(moments) * len(MOMENT_ROWS) * (len(names) + 1)
            self._report_moments(payload[start:stop].tolist(), len(moments))
            payload = torch.cat([payload[:start], payload[stop:]])
        norms = payload.sqrt_()
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

    def _report_moments(self, sums: List[float], num_probes: int) -> None:
        """Report the optimizer-state norms and cosines from the (reduced)
        sums of :meth:`StepProbe.take_moments`, read to the host at the
        publication: a name is reported where some rank's parameters keep
        that state, a cosine where neither vector is zero."""
        names = list(self.targets)
        width = len(names) + 1
        for probe in range(num_probes):
            block = sums[probe * len(MOMENT_ROWS) * width:]

            def row(name: str, segment: int) -> float:
                return block[MOMENT_ROWS.index(name) * width + segment]

            for segment, module in enumerate(names):
                key = f'{self.prefix}/{module}'
                for state in FIRST_MOMENTS:
                    if row(f'{state}:count', segment) == 0:
                        continue
                    squares = row(f'{state}:squares', segment)
                    report(f'{key}/{state}_norm', math.sqrt(squares))
                    grads = row(f'{state}:grad_squares', segment)
                    if squares > 0 and grads > 0:
                        report(
                            f'{key}/{state}_cos',
                            row(f'{state}:dot', segment) /
                            math.sqrt(squares * grads))
                for state in SECOND_MOMENTS:
                    if row(f'{state}:count', segment) > 0:
                        report(f'{key}/{state}_sqrt_norm',
                               math.sqrt(row(f'{state}:sum', segment)))


def _deepspeed(wrapper: Any, stats: Sequence[str]) -> bool:
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


def _last_step_before_publication(runner: Runner, batch_idx: int,
                                  optim_wrapper: OptimWrapper,
                                  publishes_after: Callable[[Runner, int],
                                                            bool]) -> bool:
    """Whether the optimizer steps in training iteration ``batch_idx`` and
    it is the last step up to a publication (gradient accumulation: a
    publication within the next ``accumulative_counts`` iterations).

    Args:
        publishes_after (Callable): ``(runner, batch_idx) -> bool``, the
            publication rule.
    """
    if not optim_wrapper.should_sync():  # no step in this iteration
        return False
    from mmengine.runner import EpochBasedTrainLoop
    counts = optim_wrapper._accumulative_counts
    if isinstance(runner.train_loop, EpochBasedTrainLoop):
        last = len(runner.train_dataloader) - 1  # always publishes
        if batch_idx + counts - 1 >= last:
            return True
    return any(
        publishes_after(runner, batch_idx + ahead) for ahead in range(counts))


# -- activation probes --------------------------------------------------
_LIB = torch.library.Library('mmstats', 'FRAGMENT')
_LIB.define('module_act(Tensor value, int probes, str name) -> ()')
_PROBES: 'weakref.WeakValueDictionary[int, ActivationProbes]' = (
    weakref.WeakValueDictionary())
_IDS = itertools.count()


def _module_act_kernel(value: torch.Tensor, probes: int, name: str) -> None:
    owner = _PROBES.get(probes)
    if owner is not None:
        owner.record(name, value)


def _module_act_fake(value: torch.Tensor, probes: int, name: str) -> None:
    return None


_LIB.impl('module_act', _module_act_kernel, 'CompositeExplicitAutograd')
torch.library.register_fake('mmstats::module_act', _module_act_fake, lib=_LIB)
has_side_effect(torch.ops.mmstats.module_act.default)

# The autograd engine's current graph task (-1 outside a backward pass); the
# function torch.utils.checkpoint itself uses to find its recomputations.
_graph_task_id = getattr(torch._C, '_current_graph_task_id', None)


def in_backward() -> bool:
    """Whether the autograd engine is running a backward pass on this
    thread (where activation checkpointing recomputes forwards).

    Example:
        >>> in_backward()  # a forward, or no pass at all
        False
    """
    return _graph_task_id is not None and _graph_task_id() != -1


in_backward.available = _graph_task_id is not None


class ActivationProbes:
    """One forward hook per module, registered at construction and kept
    until :meth:`remove`; outputs are reported only while :attr:`armed`,
    and checked for NaN/inf by ``watch`` while :attr:`armed` or
    :attr:`watching`.

    Args:
        modules (dict[str, nn.Module]): The modules by name.
        prefix (str): Outputs of module ``name`` are reported as
            ``<prefix>/<name>/act``.
        watch (NonfiniteWatch, optional): Told of every output seen (module
            indices in the order of ``modules``). Defaults to None.
        report_acts (bool): Whether to report the outputs (or only watch
            them). Defaults to True.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from mmstats import Collector
        >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
        >>> collector = Collector('acts/.*')
        >>> probes = ActivationProbes({'0': net[0]}, 'acts')
        >>> probes.armed = True
        >>> _ = net(torch.ones(4, 3))  # 4 x 2 output values reported
        >>> probes.remove()
        >>> collector.update()
        >>> collector.num('acts/0/act')
        8.0
    """

    def __init__(self,
                 modules: Dict[str, nn.Module],
                 prefix: str,
                 watch: Optional[NonfiniteWatch] = None,
                 report_acts: bool = True) -> None:
        self.armed = False
        self.watching = False  # watch every iteration, not only armed ones
        self.watch = watch
        self.report_acts = report_acts
        self.cost = 0.0  # host seconds spent recording, reset by the owner
        self.seen: set = set()  # keys recorded while armed (owner clears)
        self._index = {
            f'{prefix}/{name}/act': i
            for i, name in enumerate(modules)
        }
        self.id = next(_IDS)
        _PROBES[self.id] = self
        self._handles: List[torch.utils.hooks.RemovableHandle] = [
            module.register_forward_hook(self._hook(f'{prefix}/{name}/act'))
            for name, module in modules.items()
        ]

    def _hook(self, key: str):
        probes = self.id

        def forward_hook(module, args, output) -> None:
            if torch.compiler.is_compiling():
                for tensor in floating_tensors(output):
                    torch.ops.mmstats.module_act(tensor, probes, key)
            elif self.armed or self.watching:
                for tensor in floating_tensors(output):
                    self.record(key, tensor)

        return forward_hook

    def record(self, key: str, tensor: torch.Tensor) -> None:
        """Report ``tensor`` under ``key`` if armed (and watch it if armed
        or watching), unless it is a checkpoint's recomputation."""
        if not (self.armed or self.watching) or in_backward():
            return
        start = time.perf_counter()
        if self.watch is not None:
            self.watch.forward(self._index[key], tensor.detach())
        if self.armed and self.report_acts:
            report(key, tensor.detach())
            self.seen.add(key)
        self.cost += time.perf_counter() - start

    def remove(self) -> None:
        """Remove the forward hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.armed = self.watching = False
        _PROBES.pop(self.id, None)


# -- step probes --------------------------------------------------------
# rows of StepProbe.squares
GRAD, UPDATE, BEFORE = 0, 1, 2
# rows of StepProbe.moments: per first moment m, the sums of m**2, of
# grad * m, of grad**2 and the number of parameter parts keeping m; per
# second moment v, the sum of v and that number
MOMENT_ROWS = tuple(f'{state}:{row}' for state in FIRST_MOMENTS
                    for row in ('squares', 'dot', 'grad_squares', 'count')) + \
    tuple(f'{state}:{row}' for state in SECOND_MOMENTS
          for row in ('sum', 'count'))


class StepProbe:
    """Gradient and update sums of squares of the segments (modules, and
    one segment for all the parameters) whose parameters one optimizer
    owns.

    Args:
        optim_wrapper (OptimWrapper): The wrapper of the optimizer.
        parts (list[tuple[tuple[int, ...], ParamPart]]): ``(segments,
            part)``: every local parameter part once, with the segments it
            counts in (nested modules, the total).
        num_segments (int): Number of segments.
        stats (Sequence[str]): Which of ``grad_norm`` and ``update_ratio``
            to take.
        device (torch.device): Where the sums live.
        optimizer_state (bool): Whether to take the sums of the optimizer's
            moments (``MOMENT_ROWS``) after an armed step. Defaults to
            False.
        watch (NonfiniteWatch, optional): Told of the gradients' sums of
            squares of the first ``len(watch.names)`` segments at armed or
            watched steps. Defaults to None.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from mmengine.optim import OptimWrapper
        >>> from mmstats.sharding import ParamLayout
        >>> net = nn.Linear(2, 1, bias=False)
        >>> wrapper = OptimWrapper(torch.optim.SGD(net.parameters(), lr=1.))
        >>> parts = [((0, ), part) for part in ParamLayout(net).parts]
        >>> probe = StepProbe(wrapper, parts, 1, ['grad_norm'],
        ...                   torch.device('cpu'))
        >>> probe.begin_iteration(armed=True)
        >>> net(torch.ones(1, 2)).sum().backward()  # gradient (1, 1)
        >>> wrapper.step()
        >>> _ = probe.end_iteration()
        >>> squares, present = probe.take()
        >>> round(squares[GRAD, 0].item(), 9), present  # squares: 1 + 1
        (2.0, [0])
        >>> probe.remove()
    """

    def __init__(self,
                 optim_wrapper: OptimWrapper,
                 parts: List[Tuple[Tuple[int, ...], ParamPart]],
                 num_segments: int,
                 stats: Sequence[str],
                 device: torch.device,
                 optimizer_state: bool = False,
                 watch: Optional[NonfiniteWatch] = None) -> None:
        self.optim_wrapper = optim_wrapper
        self.optimizer_state = optimizer_state
        self.watch = watch
        self.watching = False
        # per tuple of missing gradients: (half, rows, modules)
        self._watch_index: Dict[tuple, tuple] = {}
        self._watch_clipped: Optional[tuple] = None
        optimizer = optim_wrapper.optimizer
        #: the DeepSpeed engine (its optimizer owns every parameter)
        self.engine = getattr(optim_wrapper, '_model', None)
        mine = None if self.engine is not None else {
            id(p)
            for group in optimizer.param_groups
            for p in group['params']
        }
        self.parts = [
            (s, p) for s, p in parts
            if p.trainable and (mine is None or id(p.optim_key) in mine)
        ]
        # the parts counting in some watched module, and their segments
        targets = len(watch.names) if watch is not None else 0
        watched = [(s, p) for s, p in self.parts
                   if any(t < targets for t in s)]
        self._watch_segments = [s for s, _ in watched]
        self._watch_parts = [p for _, p in watched]
        self.num_segments = num_segments
        self.device = device
        self.stats = [s for s in stats if s in ('grad_norm', 'update_ratio')]
        scaler = getattr(optim_wrapper, 'loss_scaler', None)
        self.amp = scaler is not None and scaler.is_enabled()
        self.armed = False
        self.calls = 0  # optimizer steps in this iteration
        self.cost = 0.0
        #: (3, num_segments) float64: gradient, update and weight-before
        #: sums of squares of the last armed step that happened, or None
        self.squares: Optional[Tensor] = None
        #: the segments that had a gradient at that step
        self.present: List[int] = []
        #: (len(MOMENT_ROWS), num_segments) float64 sums of the optimizer's
        #: moments after the last armed step that happened, or None
        self.moments: Optional[Tensor] = None
        self._count_before = 0
        self._before: Optional[tuple] = None
        self._clipped: Optional[tuple] = None
        self._handles = [] if self.engine is not None else [
            optimizer.register_step_pre_hook(
                torch.compiler.disable(self._pre_step)),
            optimizer.register_step_post_hook(
                torch.compiler.disable(self._post_step)),
        ]
        self._step = None
        self._own_step = False  # step was an attribute of the wrapper
        if self.engine is not None:  # ZeRO optimizers have no step hooks
            self._step = optim_wrapper.step
            self._own_step = 'step' in vars(optim_wrapper)

            def step(**kwargs) -> None:
                self._engine_step(**kwargs)

            # keep what marks the step we wrap: mmengine's parameter
            # schedulers wrap it before us and warn at their first step if
            # their ``_with_counter`` is gone
            optim_wrapper.step = functools.wraps(self._step)(step)
        self._clip = None
        if getattr(optim_wrapper, 'clip_grad_kwargs', None):
            self._clip = optim_wrapper._clip_grad
            optim_wrapper._clip_grad = torch.compiler.disable(self._clip_grad)

    # -- per iteration (called by the hook, outside compiled code) --------
    def begin_iteration(self, armed: bool, watching: bool = False) -> None:
        """Arm (or not) the statistics of this iteration's steps; watch
        (or not) their gradients for NaN/inf."""
        self.watching = watching and self.watch is not None
        self.armed = armed and bool(
            self.stats or self.optimizer_state) and bool(self.parts)
        self.calls = 0
        self._count_before = getattr(self.optim_wrapper, '_inner_count', 0)

    def end_iteration(self) -> int:
        """Disarm; return how many due steps the GradScaler skipped in this
        iteration (0 without AMP)."""
        self.armed = False
        self._before = self._clipped = self._watch_clipped = None
        if not self.amp:
            return 0
        wrapper = self.optim_wrapper
        due = int(wrapper._inner_count != self._count_before
                  and wrapper.should_update())
        return max(due - self.calls, 0)

    def take(self) -> Tuple[Tensor, List[int]]:
        """The sums of squares of the last armed step (zeros if none
        happened on this rank) and the segments that had a gradient there;
        forget them."""
        squares, present = self.squares, self.present
        self.squares, self.present = None, []
        if squares is None:
            squares = torch.zeros(
                3, self.num_segments, dtype=torch.float64, device=self.device)
        return squares, present

    def take_moments(self) -> Tensor:
        """The sums of the optimizer's moments after the last armed step
        (zeros if none happened on this rank); forget them."""
        moments, self.moments = self.moments, None
        if moments is None:
            moments = torch.zeros(
                len(MOMENT_ROWS),
                self.num_segments,
                dtype=torch.float64,
                device=self.device)
        return moments

    def remove(self) -> None:
        """Remove the step hooks (and the clipping probe)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._clip is not None:
            del self.optim_wrapper._clip_grad  # the class's method again
            self._clip = None
        if self._step is not None:  # the step we wrapped again
            if self._own_step:
                self.optim_wrapper.step = self._step
            else:
                del self.optim_wrapper.step
            self._step = None

    # -- the hooks ---------------------------------------------------------
    def _with_grad(self) -> List[Tuple[int, ParamPart, Tensor]]:
        """``(segments, part, local gradient)`` of the parts that have a
        gradient (a part whose parameter has none is left out)."""
        found = []
        for segments, part in self.parts:
            grad = part.grad()
            if grad is not None:
                found.append((segments, part, grad))
        return found

    def _take_grads(self) -> Tuple[Tensor, list]:
        found = self._with_grad()
        squares = sum_squares([g for _, _, g in found],
                              [s for s, _, _ in found], self.num_segments,
                              self.device)
        return squares, found

    def _engine_step(self, **kwargs) -> None:
        """DeepSpeedOptimWrapper.step: the engine's gradients are reduced
        and readable until its step, at an accumulation boundary."""
        boundary = self.engine.is_gradient_accumulation_boundary()
        if boundary:
            self._pre_step(None, (), {})
        self._step(**kwargs)
        if boundary:
            self._post_step(None, (), {})

    def _watch_grads(self) -> Optional[Tuple[List[Tensor], Tensor, Tensor]]:
        """The arguments of :meth:`NonfiniteWatch.backward_parts`: one
        norm per gradient tensor of a watched module (float32 for half
        gradients), mapped to the modules by an index cached per set of
        missing gradients (None without gradients). Per step: a walk over
        the watched parts and one ``torch._foreach_norm``."""
        grads = [part.grad() for part in self._watch_parts]
        missing = tuple(i for i, grad in enumerate(grads) if grad is None)
        layout = self._watch_index.get(missing)
        if layout is None:
            if len(self._watch_index) >= 4:  # changing layouts: stay bounded
                self._watch_index.clear()
            layout = self._watch_index[missing] = self._watch_layout(grads)
        if missing:
            grads = [grad for grad in grads if grad is not None]
        if not grads:
            return None
        half, rows, modules = layout
        norms = torch._foreach_norm(
            grads, 2, dtype=torch.float32 if half else None)
        return norms, rows, modules

    def _watch_layout(self, grads: List[Optional[Tensor]]) -> tuple:
        """``(half, rows, modules)`` of the present ``grads``: whether
        some is half precision, and watched module ``modules[k]`` is
        non-finite if the norm ``rows[k]`` is."""
        targets = len(self.watch.names)
        present = [(segments, grad)
                   for segments, grad in zip(self._watch_segments, grads)
                   if grad is not None]
        half = any(
            grad.dtype in (torch.float16, torch.bfloat16)
            for _, grad in present)
        rows = [
            i for i, (s, _) in enumerate(present) for t in s if t < targets
        ]
        modules = [t for s, _ in present for t in s if t < targets]
        return (half, ) + tuple(
            torch.tensor(column, dtype=torch.long, device=self.device)
            for column in (rows, modules))

    def _takes_grads(self) -> bool:
        """Whether this step's gradients are read: for the statistics, or
        for the watch (on an armed or watched iteration)."""
        return (self.armed
                and bool(self.stats)) or (self.watch is not None and
                                          (self.armed or self.watching))

    def _clip_grad(self) -> None:
        if self._takes_grads():  # before clipping, kept if the step happens
            start = time.perf_counter()
            if self.armed and self.stats:
                self._clipped = self._take_grads()
            else:
                self._watch_clipped = self._watch_grads()
            self.cost += time.perf_counter() - start
        self._clip()

    def _pre_step(self, optimizer, args, kwargs) -> None:
        self.calls += 1
        if not self._takes_grads():
            return
        start = time.perf_counter()
        if not (self.armed and self.stats):  # watched only: the cheap check
            checked, self._watch_clipped = self._watch_clipped, None
            if checked is None:
                checked = self._watch_grads()
            if checked is not None:  # the step happens: its gradients count
                self.watch.backward_parts(*checked)
            self.cost += time.perf_counter() - start
            return
        grads, found = (
            self._clipped if self._clipped is not None else self._take_grads())
        self._clipped = None
        if self.watch is not None:
            self.watch.backward(grads[:len(self.watch.names)])
        self.squares = torch.zeros(
            3, self.num_segments, dtype=torch.float64, device=self.device)
        self.squares[GRAD] = grads
        self.present = sorted(
            {s
             for segments, _, _ in found
             for s in segments})
        if 'update_ratio' in self.stats and found:  # copies of the weights
            parts = [(segments, part) for segments, part, _ in found]
            self._before = (parts,
                            torch._foreach_mul(
                                [part.weight() for _, part in parts], 1.0))
        self.cost += time.perf_counter() - start

    def _post_step(self, optimizer, args, kwargs) -> None:
        if not self.armed:
            return
        start = time.perf_counter()
        if self.optimizer_state:
            self.moments = self._moment_sums()
        if self._before is not None and self.squares is not None:
            self._update_sums()
        self.cost += time.perf_counter() - start

    def _moment_sums(self) -> Tensor:
        """Per segment, the ``MOMENT_ROWS`` sums over the local parts of
        the parameters that have a gradient and keep the state, read from
        ``optimizer.state`` after the step."""
        states = self.optim_wrapper.optimizer.state
        found: Dict[str, list] = {
            s: []
            for s in FIRST_MOMENTS + SECOND_MOMENTS
        }
        for segments, part in self.parts:
            entry = states.get(part.optim_key)
            grad = part.grad() if entry else None
            if grad is None:
                continue
            for name, lists in found.items():
                value = entry.get(name)
                if isinstance(value, Tensor):
                    lists.append((segments, part.state(value),
                                  grad.detach().reshape(-1)))
        out = torch.zeros(
            len(MOMENT_ROWS),
            self.num_segments,
            dtype=torch.float64,
            device=self.device)
        for name, lists in found.items():
            if not lists:
                continue
            segments = [s for s, _, _ in lists]
            values = [v for _, v, _ in lists]
            row = MOMENT_ROWS.index(f'{name}:count')
            out[row] = segment_sum(
                torch.ones(len(lists), device=self.device), segments,
                self.num_segments)
            if name in SECOND_MOMENTS:  # v >= 0: its L1 norm is its sum
                out[MOMENT_ROWS.index(f'{name}:sum')] = segment_sum(
                    torch.stack(
                        torch._foreach_norm(values, 1, dtype=torch.float64)),
                    segments, self.num_segments)
                continue
            grads = [g for _, _, g in lists]
            out[MOMENT_ROWS.index(f'{name}:squares')] = sum_squares(
                values, segments, self.num_segments, self.device)
            out[MOMENT_ROWS.index(f'{name}:dot')] = segment_sum(
                float64_dots(grads, values), segments, self.num_segments)
            out[MOMENT_ROWS.index(f'{name}:grad_squares')] = sum_squares(
                grads, segments, self.num_segments, self.device)
        return out

    def _update_sums(self) -> None:
        (parts, before), self._before = self._before, None
        after = [part.weight() for _, part in parts]
        segments = [segments for segments, _ in parts]
        self.squares[UPDATE] = sum_squares(
            torch._foreach_sub(after, before), segments, self.num_segments,
            self.device)
        self.squares[BEFORE] = sum_squares(before, segments, self.num_segments,
                                           self.device)


#: Elements per float64 chunk of :func:`float64_dots` (32 MiB per operand).
DOT_CHUNK = 1 << 22


def float64_dots(a: Sequence[Tensor], b: Sequence[Tensor]) -> Tensor:
    """``[sum(a[i] * b[i]) for i]`` (float64) with every product formed in
    float64 and summed there: exact products of float32, bfloat16 and
    float16 elements (a product in their own dtype keeps 24, 8 or 11 bits:
    1e-8 to 1e-3 relative). No host sync.

    The flattened pairs are copied into float64 chunks of at most
    ``DOT_CHUNK`` elements (a larger tensor in pieces): per chunk one
    ``cat`` per operand, one ``mul_`` and one ``segment_reduce``, so the
    kernels launched grow with the elements, not with the number of
    tensors, and the copies stay within 2 x 32 MiB.

    Example:
        >>> import torch
        >>> g = torch.full((3, ), 1 + 2.**-12)  # float32
        >>> exact = 3 * (1 + 2.**-12)**2
        >>> float(float64_dots([g], [g])[0]) == exact
        True
        >>> float((g * g).sum(dtype=torch.float64)) == exact  # float32 g * g
        False
    """
    if not len(a):
        return torch.zeros(0, dtype=torch.float64)
    device = a[0].device
    pieces: List[Tuple[int, Tensor, Tensor]] = []
    for i, (x, y) in enumerate(zip(a, b)):
        x, y = x.reshape(-1), y.reshape(-1)
        if x.numel() > DOT_CHUNK:
            pieces += [(i, p, q)
                       for p, q in zip(x.split(DOT_CHUNK), y.split(DOT_CHUNK))]
        else:
            pieces.append((i, x, y))
    sums, chunk, size = [], [], 0
    for piece in pieces + [None]:  # None: the end
        if chunk and (piece is None or size + piece[1].numel() > DOT_CHUNK):
            x, y = (
                torch.cat([p[k] for p in chunk],
                          out=torch.empty(
                              size, dtype=torch.float64, device=device))
                for k in (1, 2))
            lengths = torch.tensor([p[1].numel() for p in chunk],
                                   device=device)
            sums.append(
                torch.segment_reduce(x.mul_(y), 'sum', lengths=lengths))
            chunk, size = [], 0
        if piece is not None:
            chunk.append(piece)
            size += piece[1].numel()
    out = torch.cat(sums)
    if len(pieces) > len(a):  # pieces of one tensor added up
        owners = torch.tensor([p[0] for p in pieces], device=device)
        out = torch.zeros(
            len(a), dtype=torch.float64,
            device=device).index_add_(0, owners, out)
    return out


def floating_tensors(output: Any) -> List[torch.Tensor]:
    """The floating-point tensors of a module's output (tensor, tuple, list
    or dict, nested).

    Example:
        >>> import torch
        >>> out = {'logits': torch.ones(2), 'ids': torch.arange(2),
        ...        'aux': [torch.zeros(3)]}
        >>> [t.shape[0] for t in floating_tensors(out)]
        [2, 3]
    """
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in floating_tensors(item)]
    return []
