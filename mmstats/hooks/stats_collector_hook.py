# Copyright (c) mmstats contributors. All rights reserved.
"""StatsCollectorHook: publish what :func:`mmstats.report` recorded where
LoggerHook logs (:mod:`.text_line`), with the health checks of
:mod:`mmstats.health`; its argument checks: :mod:`.stats_collector_args`."""
from __future__ import annotations
from functools import partial
from typing import TYPE_CHECKING, Dict, Optional, Sequence

from mmengine.dist import get_world_size
from mmengine.hooks import Hook
from mmengine.hooks.hook import DATA_BATCH

from mmstats.dist import slowest_rank
from mmstats.health import (HealthConfig, HealthPolicy, gather_origins,
                            histogram_writers, rank_origin, write_histograms)
from mmstats.publish import (OUTPUTS_PREFIX, PublicationSchedule, StatsLayout,
                             WorkerBatches, collector_patterns, log_own_line,
                             refuse_unchecked_strategy, report_iteration_times)
from mmstats.publish.step_records import join_step_records
from mmstats.registry import HOOKS
from mmstats.run_description import log_run_description
from mmstats.stats import Collector, phase, report
from mmstats.utils.args import (check_keywords, compile_regex,
                                refuse_second_instance)
from .interfaces import (StatisticsPublisher, nonfinite_alarm,
                         nonfinite_origins, published_names, single_value_kind)
from .stats_collector_args import (COLLECTABLE, accept_deprecated_keywords,
                                   check_collect, check_collector_args,
                                   optional_regex, quantile_levels)

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['StatsCollectorHook']

OWNER = 'StatsCollectorHook'
#: where a checkpoint's ``meta`` holds the spike histories
SPIKES_KEY = 'mmstats_spike_history'


@HOOKS.register_module()
@accept_deprecated_keywords  # the keywords of 0.2 and before
@check_keywords
class StatsCollectorHook(Hook, StatisticsPublisher):
    """Reduce what :func:`mmstats.report` recorded over all ranks and log it.

    All ranks publish (a collective) where LoggerHook writes a training line
    and at every epoch end, so each publication covers exactly the
    iterations since the previous one: every statistic of ``stats`` to the
    visualizers and the message hub as ``<prefix>/<name>/<stat>``, the short
    keys ``<name>/<stat>`` of ``log_stats`` to the text line.
    Validation and test values are kept apart (``val/``, ``test/``) and
    published when their loop ends; values from DataLoader workers count
    with the iteration that consumes their batch. The last iteration of an
    iteration-based run is a publication too (with a text line of its own
    where LoggerHook writes none), and iterations a run ends without
    publishing are published in ``after_train``. ``nonfinite`` counts belong
    to the interval they happened in. Collectors live from ``before_run``
    to ``after_run``: building the hook makes nothing live. See
    ``docs/logging.md``.

    The health checks (NaN/inf, spikes, histograms) are configured by
    ``health=dict(...)`` (:class:`~mmstats.health.HealthConfig`) and
    decided by a :class:`~mmstats.health.HealthPolicy`. A misspelt
    argument names the closest one; a second StatsCollectorHook in the
    same run is refused at ``before_run``.

    Args:
        interval (int, optional): Publish every ``interval`` inner
            iterations (LoggerHook's rule). None: the LoggerHook's interval
            (10 without one). Ignored with ``by_epoch=True``. Defaults to
            None.
        by_epoch (bool): One summary per epoch instead. Defaults to False.
        regex (str): Only names matching it (``re.fullmatch``) are published;
            inline flags such as ``'(?i)loss'`` are allowed at its start.
            Defaults to ``'.*'``.
        stats (Sequence[str]): Statistics to publish, from ``'num'``,
            ``'mean'``, ``'std'``, ``'min'``, ``'max'``, ``'nonfinite'`` and
            quantiles ``'pNN'`` (e.g. ``'p50'``, ``'p99.9'``: quantile
            sketches within 1% relative; memory and traffic in
            ``docs/quantiles.md``). Defaults to ``('mean', 'std', 'min',
            'max')``.
        log_stats (Sequence[str]): The subset of ``stats`` shown in the text
            log line (keeps lines short). Defaults to ``('mean', )``.
        prefix (str): Prefix of the visualizer and message hub keys (the
            text line's short keys have none). Defaults to 'stats'.
        collect (Sequence[str]): What the hook reports itself, besides the
            names ``report()`` gets: ``'outputs'``, the losses that
            ``train_step`` returns (all-rank statistics instead of rank
            0's), published under their own names (``loss``; if the model
            also reports a name that ``train_step`` returns, the two stay
            apart: the model's under the name, ``train_step``'s as
            ``train_step/<name>``, with a warning); ``'timing'``, every
            rank's iteration ``time`` and ``data_time`` (the log shows their
            max over ranks; the visualizers get
            ``<prefix>/data_time/slowest_rank``). The flags
            ``collect_outputs=False``/``collect_timing=False`` of earlier
            releases are still accepted with one WARNING naming this form.
            Defaults to ``('outputs', 'timing')``.
        keep_previous (bool): Re-publish a name's previous statistics when
            it got no new values (stale numbers on the line and in the
            visualizers); False publishes nothing for it then. Defaults to
            False.
        max_names (int): At most this many names per collector (train, val,
            test); further new names are refused with a warning (see
            :class:`mmstats.Collector`). Defaults to 1000.
        log_regex (str): Names (without ``val/``/``test/``) whose
            statistics the text line shows (``re.fullmatch``); the others
            go to the visualizers only. Defaults to ``'(?!modules/).*'``:
            all but ModuleStatsHook's, whose summary (total gradient norm,
            largest update ratio) the line shows instead.
        hub_regex (str, optional): Names whose statistics also go to the
            message hub as ``<prefix>/<name>/<stat>`` (~10 us per key and
            publication), for a hook of your own. Defaults to None.
        health (dict, optional): The health checks' options
            (:class:`~mmstats.health.HealthConfig`): ``on_nonfinite``
            (``'warn'``, ``'raise'`` or ``'ignore'``), spikes
            (``spike_regex``, ``spike_stat``, ``spike_factor``,
            ``spike_window``, ``on_spike``), histograms
            (``histogram_regex``, ``histogram_buckets``); e.g.
            ``health=dict(on_nonfinite='raise', spike_factor=8)``. None:
            the defaults (warn on NaN/inf and on spikes of ``loss``, no
            histogram). The flat keywords of earlier releases
            (``spike_factor=8``) are still accepted with one mmengine
            WARNING (in the log: a ``DeprecationWarning`` would be hidden)
            naming the new form; both forms at once are an error. See
            ``docs/spikes_histograms.md``, ``docs/nonfinite.md``. Defaults
            to None.

    Example:
        >>> # in a config: custom_hooks = [
        >>> #     dict(type='mmstats.StatsCollectorHook', stats=('mean', ))]
        >>> from mmstats.hooks import StatsCollectorHook
        >>> hook = StatsCollectorHook(stats=('mean', 'max'))
        >>> hook.collectors  # nothing is live before the run starts
        {}
    """

    priority = 'NORMAL'  # after IterTimerHook, before LoggerHook

    def __init__(self,
                 interval: Optional[int] = None,
                 by_epoch: bool = False,
                 regex: str = '.*',
                 stats: Sequence[str] = ('mean', 'std', 'min', 'max'),
                 log_stats: Sequence[str] = ('mean', ),
                 prefix: str = 'stats',
                 *,
                 collect: Sequence[str] = COLLECTABLE,
                 keep_previous: bool = False,
                 max_names: int = 1000,
                 log_regex: str = r'(?!modules/).*',
                 hub_regex: Optional[str] = None,
                 health: Optional[dict] = None) -> None:
        scoped = check_collector_args(
            interval,
            stats,
            log_stats,
            prefix,
            regex,
            max_names,
            by_epoch=by_epoch,
            keep_previous=keep_previous)
        self.schedule: Optional[PublicationSchedule] = None
        self.interval = interval
        self.by_epoch = by_epoch
        self.stats = tuple(stats)
        self.log_stats = tuple(log_stats)
        self.log_regex = compile_regex(OWNER, 'log_regex', log_regex)
        self.hub_regex = optional_regex('hub_regex', hub_regex)
        self.prefix = prefix
        self.sources = check_collect(collect)  # collect(mode) is a method
        self._patterns = collector_patterns(scoped)
        self.keep_previous = keep_previous
        self.max_names = max_names
        self.quantiles = quantile_levels(stats)
        self.health = HealthPolicy(HealthConfig.build(health), OWNER)
        self.health.config.check_sketching(bool(self.quantiles))
        # built in before_run, dropped in after_run
        self.collectors: Dict[str, Collector] = {}
        self._previous_phase: Optional[str] = None
        self._start_run()

    @property
    def interval(self) -> Optional[int]:
        """The publication interval (from ``before_run`` on, in use)."""
        return self._interval if self.schedule is None else (
            self.schedule.interval)

    @interval.setter
    def interval(self, value: Optional[int]) -> None:
        self._interval = value
        if self.schedule is not None:
            self.schedule.interval = value

    def _start_run(self) -> None:
        """Forget what a previous run published and which loaders it had."""
        self._batches = WorkerBatches()
        self._layout = StatsLayout(self.prefix, self.stats, self.log_stats,
                                   self.log_regex, self.hub_regex,
                                   self.health.flags_nonfinite, OWNER)
        self._hist_writers: list = []  # rank 0's TensorBoard / W&B backends
        self._summaries: list = []  # hooks that summarise their names
        self.health.begin_run()  # a checkpoint's spike histories, or none
        self._time_sum = 0.0
        self._unpublished = 0  # training iterations since the publication
        self._reported_nonfinite = False  # by the latest publication
        self._last_iter: Optional[int] = None  # the last one published

    def before_run(self, runner: Runner) -> None:
        """Refuse an unchecked strategy; build the publication schedule and
        the collectors of this run (they live until ``after_run``)."""
        refuse_unchecked_strategy(runner, OWNER)
        refuse_second_instance(OWNER, runner.hooks, StatsCollectorHook)
        self.schedule = PublicationSchedule(runner, self.interval,
                                            self.by_epoch)
        self._start_run()
        self._summaries = published_names(runner)
        self._layout.single_value = partial(single_value_kind, self._summaries)
        self._layout.world_size = get_world_size()
        join_step_records(runner.visualizer)
        if self.health.writes_histograms:
            self._hist_writers = histogram_writers(runner.visualizer)
        self.collectors = {
            mode:
            Collector(
                pattern,
                self.keep_previous,
                max_names=self.max_names,
                sketch=bool(self.quantiles))
            for mode, pattern in self._patterns.items()
        }

    def after_run(self, runner: Runner) -> None:
        """Drop the collectors and a checkpoint's spike histories."""
        self.collectors = {}
        self.health.end_run()

    def publishes_after(self, runner: Runner, batch_idx: int) -> bool:
        """Whether the statistics are published after training iteration
        ``batch_idx``: the rule this hook publishes by, which
        ModuleStatsHook asks too (:class:`~.interfaces.StatisticsPublisher`).

        With ``by_epoch``: after the last iteration of every epoch. Else
        where LoggerHook writes a training line, every ``interval`` inner
        iterations, at the end of every epoch and at the last iteration of
        an iteration-based run (:class:`~.schedule.PublicationSchedule`).
        """
        return self.schedule.publishes_after(runner, batch_idx)

    # -- publishing ------------------------------------------------------
    def collect(self, mode: str) -> Dict[str, Dict[str, float]]:
        """Update the collector of ``mode`` (a collective on every rank)
        and return ``{name: {stat: value}}``."""
        collector = self.collectors[mode]
        collector.update()
        results = collector.as_dict()
        if self.quantiles:  # every quantile of a name in one call
            stats, qs = zip(*self.quantiles.items())
            for name, values in results.items():
                values.update(zip(stats, collector.quantile(name, list(qs))))
        return self._layout.published(results)

    def _covered(self, mode: str) -> tuple:
        """``(last iteration, count)`` a training publication covers, for
        the health messages (None: not a training one)."""
        return (self._last_iter if mode == 'train' else None,
                self._unpublished)

    def _check_nonfinite(self, runner: Runner, results: dict,
                         mode: str) -> None:
        """Show the NaN/inf counts; where the policy reports them, gather
        where they started (one ``all_gather_object``, only then) and let
        it warn or raise on every rank together (``docs/nonfinite.md``)."""
        bad = self.health.nonfinite_counts(results)
        self._layout.nonfinite_names.update(bad)
        if mode == 'train':
            self._reported_nonfinite = self.health.reports_nonfinite(bad)
        if not self.health.reports_nonfinite(bad):
            return
        local = self._layout.local_names(  # this rank's counts
            self.collectors[mode].local_nonfinite(), bad)
        modules = nonfinite_origins(runner) if mode == 'train' else []
        origins = gather_origins(rank_origin(local, modules))
        self.health.nonfinite_found(origins, bad, *self._covered(mode))

    def _publish(self, runner: Runner, mode: str, logged: bool,
                 step: int) -> dict:
        """Collect and check the statistics of ``mode``: all of them to the
        visualizers with ``step`` (those of ``hub_regex`` to the message hub
        too); the short text ones to the message hub as ``<mode>/<key>``
        for LoggerHook's line (if ``logged``). Returns the text ones."""
        results = self.collect(mode)
        self._check_nonfinite(runner, results, mode)
        spiked = self._check_spikes(mode, results)
        every = self._layout.scalars(results)
        if mode == 'train' and 'timing' in self.sources:
            total, self._time_sum = self._time_sum, 0.0
            slowest = slowest_rank(total)
            if slowest is not None:
                every[f'{self.prefix}/data_time/slowest_rank'] = slowest
        self._layout.to_hub_history(runner.message_hub, every)
        if self._hist_writers:  # before the scalars: W&B's commit
            self._write_histograms(mode, results, step)
        if every:
            runner.visualizer.add_scalars(every, step=step)
        if spiked is not None:  # every rank, the numbers written
            raise spiked
        text = self._layout.scalars(results, text=True)
        if mode == 'train':
            for source in self._summaries:
                text.update(source.line_summary(results))
        if logged:
            self._layout.to_text_line(runner, mode, text)
        return text

    def _check_spikes(self, mode: str, results: dict) -> Optional[Exception]:
        """Let the policy check the watched names; if some spiked, find the
        ranks of their largest values (a collective, only then) and let it
        warn, or return the error to raise with ``on_spike='raise'``."""
        collector, source = self.collectors[mode], self._layout.source
        spikes = self.health.check_spikes(
            mode, results, lambda name: collector.is_new(source(name)))
        if not spikes:
            return None
        ranks = collector.largest_ranks([source(s.name) for s in spikes])
        return self.health.spikes_found(
            spikes, {s.name: ranks[source(s.name)]
                     for s in spikes}, *self._covered(mode))

    def _write_histograms(self, mode: str, results: dict, step: int) -> None:
        """The policy's names' all-rank histograms, rank 0's writers."""
        write_histograms(self._hist_writers, self.collectors[mode], results,
                         self.health.wants_histogram, self._layout.source,
                         f'{self.prefix}/',
                         self.health.config.histogram_buckets, step)

    # -- values reported in DataLoader workers ride with their batches ----
    def before_train(self, runner: Runner) -> None:
        """Wrap the loaders' ``collate_fn`` (values ride with batches)."""
        log_run_description(runner)  # once per runner, whichever hook
        self._batches.enable(runner)

    before_val = before_test = before_train

    def before_save_checkpoint(self, runner: Runner, checkpoint: dict) -> None:
        """Save the policy's spike histories with the checkpoint."""
        state = self.health.state_dict()
        if state is not None:
            checkpoint.setdefault('meta', {})[SPIKES_KEY] = state

    def after_load_checkpoint(self, runner: Runner, checkpoint: dict) -> None:
        """Continue them (also after ``before_run``'s reset)."""
        self.health.load_state_dict(checkpoint.get('meta', {}).get(SPIKES_KEY))

    def _before_iter(self,
                     runner: Runner,
                     batch_idx: int,
                     data_batch: DATA_BATCH = None,
                     mode: str = 'train') -> None:
        """Add the values that rode with ``data_batch`` to the store."""
        self._batches.deliver(data_batch)

    # -- training --------------------------------------------------------
    def after_train_iter(self,
                         runner: Runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """Report ``train_step``'s outputs and the iteration times; publish
        where the schedule says (a line of its own after the last
        iteration of an iteration-based run where LoggerHook writes
        none)."""
        if 'outputs' in self.sources and outputs:
            for name, value in outputs.items():
                report(OUTPUTS_PREFIX + name, value)
        if 'timing' in self.sources:
            self._time_sum += report_iteration_times(runner.message_hub)
        self._unpublished += 1
        if self.by_epoch:
            return
        scheduled = self.publishes_after(runner, batch_idx)
        # a NaN/inf a watch flagged in the previous iteration: published
        # (and reported) now, not at the next scheduled publication; not
        # again until a publication found every value finite
        early = (not scheduled and not self._reported_nonfinite
                 and self.health.flags_nonfinite and nonfinite_alarm(runner))
        if not (scheduled or early):
            return
        logged = scheduled and self.schedule.logs_after(runner, batch_idx)
        self._last_iter = runner.iter + 1  # the iteration that just ended
        text = self._publish(runner, 'train', logged, step=runner.iter + 1)
        self._unpublished = 0
        if not logged and self.schedule.ends_run(runner, batch_idx):
            head = f'Iter(train) [{runner.iter + 1}/{runner.max_iters}]'
            log_own_line(runner, head, text)

    def after_train_epoch(self, runner: Runner) -> None:
        """With ``by_epoch``: publish the epoch, with a line of its own."""
        if not self.by_epoch:
            return
        self._last_iter = runner.iter  # the loop counted the last one
        text = self._publish(runner, 'train', False, step=runner.epoch + 1)
        self._unpublished = 0
        log_own_line(runner, f'Epoch(train) [{runner.epoch + 1}]', text)

    def after_train(self, runner: Runner) -> None:
        """Publish the iterations a run ended without publishing (all ranks
        ran the same iterations, so they agree)."""
        if not self._unpublished:
            return
        self._last_iter = runner.iter
        text = self._publish(runner, 'train', False, step=runner.iter)
        self._unpublished = 0
        log_own_line(runner, f'Train ended at iteration {runner.iter}', text)

    # -- validation and test ---------------------------------------------
    def _leave(self, runner: Runner, mode: str) -> None:
        """Restore the previous phase; publish the loop's values at
        LoggerHook's step for its metrics."""
        phase(self._previous_phase)
        logger = self.schedule.logger
        by_epoch = logger is None or logger.log_metric_by_epoch
        step = runner.epoch if by_epoch and mode == 'val' else runner.iter
        self._publish(runner, mode, logger is not None, step)

    def before_val_epoch(self, runner: Runner) -> None:
        """Values reported from here on are ``val/`` ones."""
        self._previous_phase = phase('val')

    def after_val_epoch(self,
                        runner: Runner,
                        metrics: Optional[Dict[str, float]] = None) -> None:
        """Publish the ``val/`` values."""
        self._leave(runner, 'val')

    def before_test_epoch(self, runner: Runner) -> None:
        """Values reported from here on are ``test/`` ones."""
        self._previous_phase = phase('test')

    def after_test_epoch(self,
                         runner: Runner,
                         metrics: Optional[Dict[str, float]] = None) -> None:
        """Publish the ``test/`` values."""
        self._leave(runner, 'test')
