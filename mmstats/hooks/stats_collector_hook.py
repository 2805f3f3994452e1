# Copyright (c) mmstats contributors. All rights reserved.
"""StatsCollectorHook: publish what :func:`mmstats.report` recorded, with
its argument checks (config mistakes fail when the hook is built, naming
the argument and the fix) and what it tells LoggerHook's LogProcessor."""
from __future__ import annotations
import logging
import math
import re
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from mmengine.hooks import Hook
from mmengine.hooks.hook import DATA_BATCH
from mmengine.logging import HistoryBuffer, MessageHub, print_log

from mmstats.dist import slowest_rank
from mmstats.health import (SpikeDetector, SpikeError, describe_origins,
                            gather_origins, rank_origin, sketch_histogram)
from mmstats.health.histogram_writer import add_histogram, histogram_writers
from mmstats.health.histograms import MAX_BUCKETS
from mmstats.registry import HOOKS
from mmstats.stats import STAT_NAMES, Collector, phase, report
from mmstats.utils.args import (check_bool, check_choice, check_keywords,
                                check_log_interval, check_names,
                                check_positive_int, check_real, check_str,
                                compile_regex, refuse_second_instance,
                                scope_inline_flags)
from .interfaces import StatisticsPublisher, nonfinite_origins
from .schedule import PublicationSchedule
from .strategies import refuse_unchecked_strategy
from .text_line import write_text_line
from .worker_loaders import WorkerBatches

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['StatsCollectorHook']

OWNER = 'StatsCollectorHook'
NONFINITE_ACTIONS = ('warn', 'raise', 'ignore')
SPIKE_ACTIONS = ('warn', 'raise')
SPIKE_STATS = ('max', 'mean')
# train_step's outputs are reported under this prefix (kept apart from a
# model's own report() of the same name; published without it).
OUTPUTS_PREFIX = 'train_step/'
QUANTILE = re.compile(r'p(100|\d\d?(\.\d+)?)')  # 'p50', 'p99.9'
# History kept per message-hub key the hook writes (LogProcessor's default
# window): memory and cost per publication stay flat over a run.
HUB_HISTORY = 10
TIMING_NAMES = ('time', 'data_time')  # the log line shows their max
_PHASE_PREFIX = re.compile(r'^(val|test)/')


@HOOKS.register_module()
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

    A misspelt argument names the closest one (``intervall=5``: "did you
    mean interval?"); a second StatsCollectorHook in the same run (two
    pasted ``custom_hooks`` snippets) is refused at ``before_run``, naming
    both.

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
            quantiles ``'pNN'`` (e.g. ``'p50'``, ``'p99.9'``; the collectors
            then keep quantile sketches, within 1% relative for any float64
            magnitude. Per name they hold 16 B per bucket seen (a loss:
            ~0.2 KB; 2**16 randn values: 13 KB), plus 32.8 KB per device
            for names reporting large tensors, and send per update 8 B x
            (3 + buckets between its min and max): ~0.2 KB for a loss (1000
            names: 209 KB), 32.8 KB for values straddling zero, at most 8 MB
            for all names. ``update()`` of 1000 loss names took ~50 ms more
            on a shared CPU. Magnitudes more than 17.8 decades below a
            name's largest, or beyond the 8 MB budget, are counted but get
            no value: their quantiles are missing, with a warning. See
            ``docs/quantiles.md``). Defaults to
            ``('mean', 'std', 'min', 'max')``.
        log_stats (Sequence[str]): The subset of ``stats`` shown in the text
            log line (keeps lines short). Defaults to ``('mean', )``.
        prefix (str): Prefix of the visualizer and message hub keys (the
            text line's short keys have none). Defaults to 'stats'.
        collect_outputs (bool): Also report the losses that ``train_step``
            returns (all-rank statistics instead of rank 0's), published
            under their own names (``loss``). If the model also reports a
            name that ``train_step`` returns, the two stay apart: the
            model's under the name, ``train_step``'s as
            ``train_step/<name>``, with a warning. Defaults to True.
        collect_timing (bool): Report every rank's iteration ``time`` and
            ``data_time`` (the log shows their max over ranks; the slowest
            rank of the interval, the one with the largest summed
            ``data_time``, goes to the visualizers as
            ``<prefix>/data_time/slowest_rank``). Defaults to True.
        keep_previous (bool): Re-publish a name's previous statistics when
            it got no new values (stale numbers on the line and in the
            visualizers); False publishes nothing for it then. Defaults to
            False.
        on_nonfinite (str): When a name got NaN/inf values in an interval:
            ``'warn'`` (its ``nonfinite`` count joins the log line and one
            warning names it), ``'raise'`` (every rank raises
            ``FloatingPointError`` at the same iteration) or ``'ignore'``.
            Defaults to ``'warn'``.
        max_names (int): At most this many names per collector (train, val,
            test); further new names are refused with a warning (see
            :class:`mmstats.Collector`). Defaults to 1000.
        log_regex (str): Names (without ``val/``/``test/``) whose
            statistics the text line shows (``re.fullmatch``); the others
            go to the visualizers only. Defaults to ``'(?!modules/).*'``:
            all but ModuleStatsHook's.
        hub_regex (str, optional): Names (without ``val/``/``test/``) whose
            statistics also go to the message hub as
            ``<prefix>/<name>/<stat>`` (a history of 10 values each), for a
            hook of your own that reads ``runner.message_hub``. None: none.
            The visualizers (``scalars.json``, TensorBoard) get every
            statistic either way, and the hub always holds the text line's
            keys (``train/<name>/<stat>``, the latest value) for LoggerHook.
            Each key costs ~10 us per publication (mmengine's
            ``HistoryBuffer`` copies its history on every update), more
            than the visualizer's write of it. Defaults to None.
        spike_regex (str, optional): Training names (``re.fullmatch``)
            watched for spikes: a publication whose ``spike_stat`` over all
            ranks exceeds ``spike_factor`` times the median of the name's
            last ``spike_window`` publications (at least 5 of them) warns,
            naming the rank that reported the largest value (one small
            collective, only when a name spikes), or raises. None: off (no
            work). Defaults to ``'loss'``: the total loss ``train_step``
            returns (a healthy digits demo run stays below 1.1x). See
            ``docs/spikes_histograms.md``.
        spike_stat (str): ``'max'`` (the interval's largest value: a
            single bad batch on a single rank) or ``'mean'``. Defaults to
            ``'max'``.
        spike_factor (float): A value above this many times the median
            of its history spikes (> 1). Defaults to 4.
        spike_window (int): Publications of history per watched name.
            Defaults to 20.
        on_spike (str): ``'warn'`` (one warning per publication) or
            ``'raise'`` (:class:`~mmstats.health.SpikeError` on every
            rank at the same iteration, after that publication's statistics
            were written). Defaults to ``'warn'``.
        histogram_regex (str, optional): Names (without ``val/``/``test/``;
            ``re.fullmatch``) whose all-rank histogram goes, at every
            publication where they got values, to TensorBoard
            (``TensorboardVisBackend``: ``add_histogram_raw``) and W&B
            (``WandbVisBackend``: ``wandb.Histogram``, joining the
            publication's scalars) as ``<prefix>/<name>/hist``, made from
            the merged quantile sketch (``stats`` must hold a quantile):
            log-spaced buckets 2% wide, exact counts, min, max, sum and sum
            of squares. Other backends keep the quantile scalars. None:
            off. Defaults to None.
        histogram_buckets (int): At most this many buckets per histogram
            (adjacent ones merged beyond): at most 16 B each per name and
            publication in the event file. Defaults to 512 (W&B's limit).

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
                 collect_outputs: bool = True,
                 collect_timing: bool = True,
                 keep_previous: bool = False,
                 on_nonfinite: str = 'warn',
                 max_names: int = 1000,
                 log_regex: str = r'(?!modules/).*',
                 hub_regex: Optional[str] = None,
                 spike_regex: Optional[str] = 'loss',
                 spike_stat: str = 'max',
                 spike_factor: float = 4.,
                 spike_window: int = 20,
                 on_spike: str = 'warn',
                 histogram_regex: Optional[str] = None,
                 histogram_buckets: int = MAX_BUCKETS) -> None:
        scoped = _check_args(
            interval,
            dict(
                by_epoch=by_epoch,
                collect_outputs=collect_outputs,
                collect_timing=collect_timing,
                keep_previous=keep_previous), stats, log_stats, prefix,
            on_nonfinite, regex, max_names)
        self.schedule: Optional[PublicationSchedule] = None
        self.interval = interval
        self.by_epoch = by_epoch
        self.stats = tuple(stats)
        self.log_stats = tuple(log_stats)
        self.log_regex = compile_regex(OWNER, 'log_regex', log_regex)
        self.hub_regex = None if hub_regex is None else compile_regex(
            OWNER, 'hub_regex', hub_regex)
        self.prefix = prefix
        self.collect_outputs = collect_outputs
        self.collect_timing = collect_timing
        self.on_nonfinite = on_nonfinite
        self._patterns = _collector_patterns(scoped)
        self.keep_previous = keep_previous
        self.max_names = max_names
        self.quantiles = {
            stat: float(stat[1:]) / 100
            for stat in stats if stat not in STAT_NAMES
        }
        _check_health_args(spike_stat, spike_factor, spike_window, on_spike,
                           histogram_regex, histogram_buckets,
                           bool(self.quantiles))
        self.spike_regex = None if spike_regex is None else compile_regex(
            OWNER, 'spike_regex', spike_regex)
        self.spike_stat = spike_stat
        self.on_spike = on_spike
        self.spikes = None if spike_regex is None else SpikeDetector(
            spike_factor, spike_window)
        self.histogram_regex = None if histogram_regex is None else (
            compile_regex(OWNER, 'histogram_regex', histogram_regex))
        self.histogram_buckets = histogram_buckets
        # built in before_run, dropped in after_run
        self.collectors: Dict[str, Collector] = {}
        self._previous_phase: Optional[str] = None
        self._start_run()

    @property
    def interval(self) -> Optional[int]:
        """The publication interval: from ``before_run`` on, the one in use
        (the LoggerHook's where it was None)."""
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
        self._seen_keys: set = set()
        self._text_keys: Dict[str, set] = {}  # mode -> keys in the hub now
        self._nonfinite_names: set = set()
        self._merged_warned: set = set()
        self._layouts: Dict[tuple, tuple] = {}  # (name, text) -> keys
        self._hub_asked: Dict[str, bool] = {}  # key -> matches hub_regex
        self._sources: Dict[str, str] = {}  # published name -> collector's
        self._spike_asked: Dict[str, bool] = {}  # name -> spike_regex
        self._hist_asked: Dict[str, bool] = {}  # name -> histogram_regex
        self._hist_writers: list = []  # rank 0's TensorBoard / W&B backends
        if self.spikes is not None:
            self.spikes.reset()
        self._time_sum = 0.0
        self._unpublished = 0  # training iterations since the publication
        self._last_iter: Optional[int] = None  # the last one published

    def before_run(self, runner: Runner) -> None:
        """Refuse an unchecked strategy; build the publication schedule and
        the collectors of this run (they live until ``after_run``)."""
        refuse_unchecked_strategy(runner, OWNER)
        refuse_second_instance(OWNER, runner.hooks, StatsCollectorHook)
        self.schedule = PublicationSchedule(runner, self.interval,
                                            self.by_epoch)
        self._start_run()
        if self.histogram_regex is not None:
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
        """Drop the collectors."""
        self.collectors = {}  # no longer live: report() keeps nothing

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
        return self._unprefix_outputs(results)

    def _unprefix_outputs(self, results: dict) -> dict:
        """``train_step``'s outputs under their own names, unless the model
        reported the same name: then both stay apart (warned once)."""
        out = {}
        sources = self._sources
        for name, values in results.items():
            short = name[len(OUTPUTS_PREFIX):] if name.startswith(
                OUTPUTS_PREFIX) else None
            if short is None or short in results:
                out[name] = values
                sources[name] = name
                if short is not None and short not in self._merged_warned:
                    self._merged_warned.add(short)
                    print_log(
                        f'StatsCollectorHook: the model reports {short!r}, '
                        f'which train_step also returns: published apart, '
                        f'the model\'s as {short!r} and train_step\'s as '
                        f'{name!r} (rename one, or collect_outputs=False)',
                        'current',
                        level=logging.WARNING)
            else:
                out[short] = values
                sources[short] = name
        return out

    def _iterations_text(self, mode: str) -> str:
        """Which iterations a training publication covers, for a warning:
        ``'iteration 8 (iterations 5-8 since the previous publication'``
        (the caller closes the parenthesis)."""
        last = self._last_iter
        if mode != 'train' or last is None:
            return 'this interval (since the previous publication'
        first = last - self._unpublished + 1
        return (f'iteration {last} (iterations {first}-{last} since the '
                'previous publication')

    def _check_nonfinite(self,
                         runner: Runner,
                         results: dict,
                         mode: str = 'train') -> None:
        """Warn or raise, on every rank together, when the reduced
        statistics hold NaN/inf counts; only then one ``all_gather_object``
        tells which ranks (hosts) saw them and, from a ModuleStatsHook's
        watch, where they started (``docs/nonfinite.md``)."""
        bad = {
            name: int(values['nonfinite'])
            for name, values in results.items() if values['nonfinite']
        }
        self._nonfinite_names.update(bad)
        if not bad or self.on_nonfinite == 'ignore':
            return
        where = self._iterations_text(mode)
        local = {}  # this rank's counts, under the published names
        for name, count in self.collectors[mode].local_nonfinite().items():
            if name not in bad and name.startswith(OUTPUTS_PREFIX):
                name = name[len(OUTPUTS_PREFIX):]
            if name in bad:
                local[name] = count
        modules = nonfinite_origins(runner) if mode == 'train' else []
        origins = gather_origins(rank_origin(local, modules))
        # every rank formats the same text from the same gathered list
        message = (f'StatsCollectorHook: non-finite values reported at '
                   f'{where}, over all ranks): '
                   f'{describe_origins(origins, bad)}')
        if self.on_nonfinite == 'raise':  # same data on every rank
            raise FloatingPointError(message)
        print_log(message, 'current', level=logging.WARNING)

    def _scalars(self, results: dict, text: bool = False) -> dict:
        """``{'<prefix>/<name>/<stat>': value}`` of ``stats``, or if
        ``text`` the log line's ``{'<name>/<stat>': value}`` of
        ``log_stats`` (max for timing; ``nonfinite`` where it was seen)."""
        scalars = {}
        layouts = self._layouts
        flag_nonfinite = self.on_nonfinite != 'ignore'
        # timing first: next to LoggerHook's time and data_time (rank 0's)
        names = [n for n in TIMING_NAMES if n in results]
        names += [n for n in results if n not in TIMING_NAMES]
        for name in names:
            layout = layouts.get((name, text))
            if layout is None:
                layout = layouts[(name, text)] = self._layout(name, text)
            keys, nonfinite_key = layout
            values = results[name]
            for key, stat in keys:
                value = values[stat]
                if value == value:  # skip NaN: nothing reported yet
                    scalars[key] = value
            if (flag_nonfinite and nonfinite_key is not None
                    and name in self._nonfinite_names):
                scalars[nonfinite_key] = values['nonfinite']
        return scalars

    def _layout(self, name: str, text: bool) -> tuple:
        """The keys of ``name`` (computed once per run): ``((key, stat),
        ...)`` and the key its ``nonfinite`` count takes where it was seen
        (None when ``nonfinite`` is published anyway)."""
        prefix = '' if text else f'{self.prefix}/'
        if text and name in TIMING_NAMES and 'max' in self.stats:
            stats = ('max', )  # the slowest rank's iteration
        elif text and not self.log_regex.fullmatch(
                _PHASE_PREFIX.sub('', name)):
            stats = ()  # in scalars.json only (NaN counts still shown)
        else:
            stats = self.log_stats if text else self.stats
        keys = tuple((f'{prefix}{name}/{stat}', stat) for stat in stats)
        nonfinite = (None
                     if 'nonfinite' in stats else f'{prefix}{name}/nonfinite')
        return keys, nonfinite

    def _publish(self, runner: Runner, mode: str, logged: bool,
                 step: int) -> dict:
        """Collect and check the statistics of ``mode``: all of them to the
        visualizers with ``step`` (those of ``hub_regex`` to the message hub
        too); the short text ones to the message hub as ``<mode>/<key>``
        for LoggerHook's line (if ``logged``). Returns the text ones."""
        results = self.collect(mode)
        self._check_nonfinite(runner, results, mode)
        spiked = self._check_spikes(runner, mode, results)
        every = self._scalars(results)
        if mode == 'train' and self.collect_timing:
            total, self._time_sum = self._time_sum, 0.0
            slowest = slowest_rank(total)
            if slowest is not None:
                every[f'{self.prefix}/data_time/slowest_rank'] = slowest
        if self.hub_regex is not None:
            self._to_hub_history(runner.message_hub, every)
        if self._hist_writers:  # before the scalars: W&B's commit
            self._write_histograms(mode, results, step)
        if every:
            runner.visualizer.add_scalars(every, step=step)
        if spiked is not None:  # every rank, the numbers written
            raise SpikeError(spiked)
        text = self._scalars(results, text=True)
        if logged:
            self._to_message_hub(runner, mode, text)
        return text

    def _asked(self, cache: dict, regex: Any, name: str) -> bool:
        """Whether ``regex`` matches ``name`` without ``val/``/``test/``
        (decided once per name and run)."""
        wanted = cache.get(name)
        if wanted is None:
            wanted = cache[name] = regex.fullmatch(
                _PHASE_PREFIX.sub('', name)) is not None
        return wanted

    def _check_spikes(self, runner: Runner, mode: str,
                      results: dict) -> Optional[str]:
        """Feed the watched training names' new ``spike_stat`` to the
        detector (the same on every rank); warn about spikes, naming the
        rank with the largest value (a collective, only then). Returns the
        message where ``on_spike='raise'``."""
        if self.spikes is None or mode != 'train':
            return None
        collector, sources = self.collectors[mode], self._sources
        watched = {
            name: values[self.spike_stat]
            for name, values in results.items()
            if self._asked(self._spike_asked, self.spike_regex, name)
            and collector.is_new(sources.get(name, name))
        }
        spikes = self.spikes.check(watched) if watched else []
        if not spikes:
            return None
        ranks = collector.largest_ranks(
            [sources.get(spike.name, spike.name) for spike in spikes])
        where = self._iterations_text(mode)
        text = '; '.join(
            f'{spike.name} {self.spike_stat} {spike.value:.6g} is '
            f'{spike.ratio:.3g}x the median {spike.median:.6g} of its last '
            f'{spike.count} publications '
            f'(largest value from rank '
            f'{ranks[sources.get(spike.name, spike.name)]})'
            for spike in spikes)
        message = (f'StatsCollectorHook: spike at {where}, over all ranks; '
                   f'spike_factor={self.spikes.factor:g}): {text}')
        if self.on_spike == 'raise':
            return message
        print_log(message, 'current', level=logging.WARNING)
        return None

    def _write_histograms(self, mode: str, results: dict, step: int) -> None:
        """The all-rank histograms of the names ``histogram_regex``
        matches that got values now, to TensorBoard and W&B (rank 0)."""
        collector, sources = self.collectors[mode], self._sources
        for name, values in results.items():
            source = sources.get(name, name)
            if not (self._asked(self._hist_asked, self.histogram_regex, name)
                    and collector.is_new(source)):
                continue
            sketch = collector.sketch(source)
            hist = None if sketch is None else sketch_histogram(
                sketch, values['num'], values['mean'], values['std'],
                values['min'], values['max'], self.histogram_buckets)
            if hist is None:
                continue
            tag = f'{self.prefix}/{name}/hist'
            for backend in self._hist_writers:
                add_histogram(backend, tag, hist, step)

    def _to_hub_history(self, hub: MessageHub, scalars: dict) -> None:
        """The ``<prefix>/<name>/<stat>`` keys of the names ``hub_regex``
        matches, with a history, into the message hub."""
        asked = self._hub_asked
        for key, value in scalars.items():
            wanted = asked.get(key)
            if wanted is None:  # decided once per key and run
                name = key[len(self.prefix) + 1:key.rindex('/')]
                wanted = asked[key] = self.hub_regex.fullmatch(
                    _PHASE_PREFIX.sub('', name)) is not None
            if wanted:
                _hub_scalar(hub, key, value)

    def _to_message_hub(self, runner: Runner, mode: str,
                        scalars: dict) -> None:
        """Store ``scalars`` as ``<mode>/<key>`` for LoggerHook to log, and
        take out the keys of the previous publication that have no value
        now (the line must not show a stale one)."""
        self._text_keys[mode] = write_text_line(
            runner, mode, scalars, self._text_keys.get(mode, set()),
            self._seen_keys)

    def _log_line(self, runner: Runner, head: str, text: dict) -> None:
        """A line of the hook's own where LoggerHook writes none
        (LogProcessor's number format)."""
        if text:
            digits = getattr(runner.log_processor, 'num_digits', 4)
            runner.logger.info(f'{head}  ' +
                               '  '.join(f'{k}: {v:.{digits}f}'
                                         for k, v in text.items()))

    # -- values reported in DataLoader workers ride with their batches ----
    def before_train(self, runner: Runner) -> None:
        """Wrap the loaders' ``collate_fn`` (values ride with batches)."""
        self._batches.enable(runner)

    def before_val(self, runner: Runner) -> None:
        """Wrap the loaders' ``collate_fn`` (values ride with batches)."""
        self._batches.enable(runner)

    def before_test(self, runner: Runner) -> None:
        """Wrap the loaders' ``collate_fn`` (values ride with batches)."""
        self._batches.enable(runner)

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
        if self.collect_outputs and outputs:
            for name, value in outputs.items():
                report(OUTPUTS_PREFIX + name, value)
        if self.collect_timing:
            self._time_sum += _report_iteration_times(runner)
        self._unpublished += 1
        if self.by_epoch or not self.publishes_after(runner, batch_idx):
            return
        logged = self.schedule.logs_after(runner, batch_idx)
        self._last_iter = runner.iter + 1  # the iteration that just ended
        text = self._publish(runner, 'train', logged, step=runner.iter + 1)
        self._unpublished = 0
        if not logged and self.schedule.ends_run(runner, batch_idx):
            head = f'Iter(train) [{runner.iter + 1}/{runner.max_iters}]'
            self._log_line(runner, head, text)

    def after_train_epoch(self, runner: Runner) -> None:
        """With ``by_epoch``: publish the epoch, with a line of its own."""
        if not self.by_epoch:
            return
        self._last_iter = runner.iter  # the loop counted the last one
        text = self._publish(runner, 'train', False, step=runner.epoch + 1)
        self._unpublished = 0
        self._log_line(runner, f'Epoch(train) [{runner.epoch + 1}]', text)

    def after_train(self, runner: Runner) -> None:
        """Publish the iterations a run ended without publishing (all ranks
        ran the same iterations, so they agree)."""
        if not self._unpublished:
            return
        self._last_iter = runner.iter
        text = self._publish(runner, 'train', False, step=runner.iter)
        self._unpublished = 0
        self._log_line(runner, f'Train ended at iteration {runner.iter}', text)

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


def _hub_scalar(hub: MessageHub, key: str, value: float) -> None:
    """Like ``hub.update_scalar(key, value, resumed=False)``, with a history
    of ``HUB_HISTORY`` values (mmengine's default keeps 1e6 and copies them
    on every update): flat memory and cost; nothing goes into checkpoints,
    so a resume warns about nothing."""
    buffer = hub.log_scalars.get(key)
    if buffer is None:
        hub.log_scalars[key] = HistoryBuffer([value], [1],
                                             max_length=HUB_HISTORY)
    else:
        buffer.update(value)


def _report_iteration_times(runner: Runner) -> float:
    """Report this rank's ``time`` and ``data_time`` of the iteration that
    just ended (IterTimerHook's, from the message hub) under those names;
    return the ``data_time`` (0 if there is none)."""
    data_time = 0.0
    for key in TIMING_NAMES:
        buffer = runner.message_hub.log_scalars.get(f'train/{key}')
        if buffer is not None:
            value = float(buffer.current())
            report(key, value)
            if key == 'data_time':
                data_time = value
    return data_time


# -- argument checks: a wrong type is a TypeError, a wrong value a
# ValueError, the message names the argument and the fix
def _is_stat(stat: Any) -> bool:
    return stat in STAT_NAMES or (isinstance(stat, str)
                                  and QUANTILE.fullmatch(stat) is not None)


def _check_args(interval: Optional[int], flags: Dict[str, bool],
                stats: Sequence[str], log_stats: Sequence[str], prefix: str,
                on_nonfinite: str, regex: str, max_names: int) -> str:
    """Raise TypeError (a wrong type) or ValueError (a wrong value) naming
    a bad argument of StatsCollectorHook (:mod:`mmstats.utils.args`);
    return ``regex`` with its inline flags scoped."""
    check_log_interval(OWNER, interval)
    for name, flag in flags.items():
        check_bool(OWNER, name, flag)
    for name, value in (('stats', stats), ('log_stats', log_stats)):
        check_names(
            OWNER, name, value, _is_stat,
            f'a non-empty list of {STAT_NAMES} or quantiles "pNN" (e.g. '
            f'"p99"), e.g. {name}=("mean",)')
    if not set(log_stats) <= set(stats):
        raise ValueError(f'{OWNER}: log_stats {log_stats!r} '
                         f'must be a subset of stats {stats!r}')
    check_str(OWNER, 'prefix', prefix, 'stats')
    check_choice(OWNER, 'on_nonfinite', on_nonfinite, NONFINITE_ACTIONS)
    check_positive_int(OWNER, 'max_names', max_names, example=1000)
    # the user's pattern on its own: wrapping must not change it
    return compile_regex(
        OWNER,
        'regex',
        regex,
        prepare=scope_inline_flags,
        hint='; inline flags such as (?i) are allowed at its start').pattern


def _check_health_args(spike_stat: str, spike_factor: float, spike_window: int,
                       on_spike: str, histogram_regex: Optional[str],
                       histogram_buckets: int, sketching: bool) -> None:
    """Check the spike and histogram arguments (as :func:`_check_args`):
    ``histogram_regex`` needs quantile sketches (``sketching``)."""
    check_choice(OWNER, 'spike_stat', spike_stat, SPIKE_STATS)
    check_choice(OWNER, 'on_spike', on_spike, SPIKE_ACTIONS)
    check_real(OWNER, 'spike_factor', spike_factor,
               lambda v: v > 1 and math.isfinite(v),
               'a finite number > 1 (e.g. spike_factor=4.0)')
    check_positive_int(OWNER, 'spike_window', spike_window, example=20)
    check_positive_int(
        OWNER, 'histogram_buckets', histogram_buckets, example=512)
    if histogram_regex is not None and not sketching:
        raise ValueError(
            f'{OWNER}: histogram_regex={histogram_regex!r} needs quantile '
            'sketches, which only a quantile in stats switches on: add one, '
            'e.g. stats=(\'mean\', \'std\', \'min\', \'max\', '
            '\'p50\'), or set histogram_regex=None')


def _collector_patterns(scoped: str) -> Dict[str, str]:
    """The patterns of the train, val and test collectors around the user's
    (valid, flag-scoped) pattern ``scoped``: a valid pattern has balanced
    groups, so ``(?:...)`` keeps it whole. Training names may carry the
    prefix of ``train_step``'s outputs (``OUTPUTS_PREFIX``)."""
    return dict(
        train=rf'^(?!val/|test/)(?:{OUTPUTS_PREFIX})?(?:{scoped})$',
        val=rf'^val/(?:{scoped})$',
        test=rf'^test/(?:{scoped})$')
