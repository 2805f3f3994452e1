# Copyright (c) mmstats contributors. All rights reserved.
"""ModuleStatsHook: per-module activation, gradient and update statistics
on the iterations that end a publication interval (``docs/module_stats.md``).

The hook checks its arguments, builds the probes of
:mod:`mmstats.module_stats` in ``before_train`` (before ``torch.compile``
traces the model: they stay registered and are switched at run time),
arms them on the instrumented iterations and publishes what they took:
the forward probes report activations themselves, the norms are collected
at the publication (one payload, one ``all_reduce`` on sharded models)
and reported here.
"""
from __future__ import annotations
import difflib
import logging
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from mmengine.hooks import Hook
from mmengine.hooks.hook import DATA_BATCH
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper, OptimWrapperDict
from torch import nn

from mmstats.health import NonfiniteAlarm, NonfiniteWatch
from mmstats.module_stats import (ActivationProbes, ModuleNorms, StepProbe,
                                  build_step_probes, in_backward,
                                  largest_update_ratio, line_summary,
                                  single_value_kind)
from mmstats.publish import (PublicationSchedule, last_step_before_publication,
                             refuse_unchecked_strategy)
from mmstats.registry import HOOKS
from mmstats.run_description import log_run_description
from mmstats.sharding import ParamLayout, unwrap_model
from mmstats.stats import report
from mmstats.utils.args import (check_bool, check_keywords, check_names,
                                check_str, compile_regex,
                                refuse_second_instance, unmatched_alternatives)
from mmstats.utils.torch_compat import COMPILED_OPS, require_torch
from .interfaces import (NonfiniteOriginSource, PublishedNames,
                         StatisticsPublisher, find_publisher)

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['ModuleStatsHook', 'MODULE_STATS']

OWNER = 'ModuleStatsHook'
MODULE_STATS = ('act', 'grad_norm', 'weight_norm', 'update_ratio')


@HOOKS.register_module()
@check_keywords
class ModuleStatsHook(Hook, NonfiniteOriginSource, PublishedNames):
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

    A norm, ratio or cosine is one value per publication, the same on every
    rank: StatsCollectorHook publishes only its value
    (``<prefix>/<name>/grad_norm/mean``, no ``std``/``min``/``max``);
    ``instrument_ms`` keeps its spread over ranks where there are several.
    LoggerHook's line shows a summary: ``<prefix>/total_grad_norm`` and the
    largest update ratio as ``<prefix>/max_update_ratio`` (one key all
    run; an INFO line names its module when another module takes the
    lead: :func:`mmstats.module_stats.line_summary`); everything else to
    ``scalars.json`` and TensorBoard (``docs/logging.md``).

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
            NaN/inf output or gradient: flags accumulate on the device;
            a flag per iteration reaches the host one iteration later
            (no sync), and StatsCollectorHook reports at the iteration
            after the origin instead of its next publication
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
        # the hook that publishes (StatsCollectorHook), if any
        self._publisher: Optional[StatisticsPublisher] = None
        # the rule without a StatsCollectorHook
        self._schedule: Optional[PublicationSchedule] = None
        self._acts: Optional[ActivationProbes] = None
        self._watch: Optional[NonfiniteWatch] = None
        self._alarm: Optional[NonfiniteAlarm] = None  # watch_nonfinite's
        self._watched = False  # the watch saw this iteration
        self._reset_watch = False  # a publication was checked: new interval
        self._steps: List[StepProbe] = []
        self._norms: Optional[ModuleNorms] = None
        self._warned_unmatched = False
        self._warned_unseen: set = set()  # modules whose act never came
        self._publishes = False
        self._skipped = 0
        self._cost = 0.0
        self._ratio_module: Optional[str] = None  # max_update_ratio's

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
        self._publisher = find_publisher(runner)
        self._schedule = None
        if self._publisher is None:
            # LoggerHook's lines: no publication of its own at the end
            self._schedule = PublicationSchedule(runner, at_last_iter=False)

    def before_train(self, runner: Runner) -> None:
        """Find the target modules; register the
        forward and optimizer step hooks (before ``compile=True`` compiles
        ``train_step``), disarmed."""
        log_run_description(runner)  # once per runner, whichever hook
        compile_cfg = runner.cfg.get('compile')  # mmengine: True or a dict
        if compile_cfg is True or isinstance(compile_cfg, dict):
            require_torch(
                COMPILED_OPS, 'ModuleStatsHook under compile=True (its '
                'probes are custom ops inside the compiled graph)')
        self.remove()  # a second runner.train()
        self._warned_unseen = set()
        self._ratio_module = None
        model = unwrap_model(runner.model)
        self.targets = self._find_targets(model)
        self._warn_unmatched(model)
        if self._publisher is None:
            print_log(
                'ModuleStatsHook: no StatsCollectorHook in custom_hooks: '
                'the statistics are reported but only a Collector of yours '
                'publishes them',
                'current',
                level=logging.WARNING)
        self._norms = ModuleNorms(model, ParamLayout(runner.model),
                                  self.targets, self.prefix, self.stats)
        device = self._norms.device
        self._watch = NonfiniteWatch(list(self.targets), device)
        self._alarm = NonfiniteAlarm() if self.watch_nonfinite else None
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
                    level=logging.WARNING)
        wrappers = (
            dict(runner.optim_wrapper.items()) if isinstance(
                runner.optim_wrapper, OptimWrapperDict) else {
                    '': runner.optim_wrapper
                })
        self._steps = build_step_probes(
            wrappers,
            self._norms.parts,
            self._norms.num_segments,
            self.stats,
            device,
            self.optimizer_state,
            self._watch,
            keep=self.watch_nonfinite,
            owner=OWNER)

    def _find_targets(self, model: nn.Module) -> Dict[str, nn.Module]:
        """The modules whose names ``modules`` matches; a ValueError naming
        the model's modules where it matches none."""
        targets = {
            name: module
            for name, module in model.named_modules()
            if name and self.pattern.fullmatch(name)
        }
        if not targets:
            names = [n for n, _ in model.named_modules() if n]
            shown = ', '.join(
                names[:12]) + (', ...' if len(names) > 12 else '')
            raise ValueError(
                f'ModuleStatsHook: modules={self.modules!r} matches no '
                f'module name of {type(model).__name__} (re.fullmatch); '
                f'its modules are: {shown}')
        return targets

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
            level=logging.WARNING)

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
            level=logging.WARNING)

    # -- when ------------------------------------------------------------
    def publishes_after(self, runner: Runner, batch_idx: int) -> bool:
        """Whether the statistics are published after training iteration
        ``batch_idx``: StatsCollectorHook's rule (it owns it), or without
        one LoggerHook's lines."""
        if self._publisher is not None:
            return self._publisher.publishes_after(runner, batch_idx)
        return self._schedule.publishes_after(runner, batch_idx)

    def _steps_armed(self, runner: Runner, batch_idx: int,
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
            flag = self._watch.end_iteration(flag=self._alarm is not None)
            if self._alarm is not None:
                self._alarm.ring(flag)  # known one iteration later
        if not self._publishes:
            return
        self._reset_watch = True
        self._warn_unseen(runner)
        self._publish_norms()
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

    def nonfinite_seen(self) -> bool:
        """With ``watch_nonfinite``: whether some rank's watch flagged the
        previous iteration (one 1-element all_reduce on the host group,
        every rank together, once per iteration; no device sync). Asked
        by StatsCollectorHook, which then publishes (and reports) at once
        instead of at its next publication."""
        return self._alarm is not None and self._alarm.fired()

    def line_summary(self, results: dict) -> Dict[str, float]:
        """The log line's summary of a publication: the total gradient
        norm and the largest update ratio; its module said in a line of its
        own when it changes (the key stays the same)."""
        largest = largest_update_ratio(results, self.prefix)
        if largest is not None and largest[0] != self._ratio_module:
            print_log(
                f'{self.prefix}/max_update_ratio: {largest[0]} from now on' +
                (f' (was {self._ratio_module})' if self._ratio_module else ''),
                logger='current')
            self._ratio_module = largest[0]
        return line_summary(results, self.prefix)

    def single_value_kind(self, name: str) -> Optional[str]:
        """Whether ``name`` holds one value per publication (on every
        rank: ``'replicated'``; on each: ``'per_rank'``)."""
        return single_value_kind(name, self.prefix)

    def remove(self) -> None:
        """Remove every forward and optimizer step hook."""
        if self._acts is not None:
            self._acts.remove()
            self._acts = None
        for probe in self._steps:
            probe.remove()
        self._steps = []

    def _publish_norms(self) -> None:
        """Report the norms of the full tensors (:class:`ModuleNorms`: the
        probes' sums and the weights', one collective on a sharded
        model)."""
        if self._norms is None:
            return
        for name, value in self._norms.collect(self._steps):
            report(name, value)
