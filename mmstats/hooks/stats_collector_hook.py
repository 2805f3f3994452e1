# Copyright (c) mmstats contributors. All rights reserved.
"""StatsCollectorHook: publish :func:`mmstats.report` statistics to mmengine."""
import re
from typing import Dict, Optional, Sequence, Union

from mmengine.hooks import Hook, LoggerHook
from mmengine.runner import LogProcessor

from mmstats.registry import HOOKS
from mmstats.stats import STAT_NAMES, Collector, phase, report

DATA_BATCH = Optional[Union[dict, tuple, list]]
DEFAULT_INTERVAL = 10


@HOOKS.register_module()
class StatsCollectorHook(Hook):
    """Reduce what :func:`mmstats.report` recorded over all ranks and log it.

    At every ``interval`` iterations (or once per epoch with
    ``by_epoch=True``) all ranks call :meth:`Collector.update` (one
    collective) and the exact all-rank statistics of every matching name are
    published as message-hub scalars ``train/<prefix>/<name>/<stat>``, so
    mmengine's LoggerHook prints them and every visualizer backend
    (LocalVisBackend's ``scalars.json``, TensorBoard...) records them.

    With ``by_epoch=True`` the epoch summary is logged by this hook with the
    epoch as step, and stored in the message hub without the ``train/``
    prefix (``<prefix>/<name>/<stat>``) so that LoggerHook's per-iteration
    lines do not repeat it.

    mmengine's LogProcessor averages keys matching its ``mean_pattern``
    (``loss``, ``time``...) over its ``window_size`` past values; the hook
    adds a ``custom_cfg`` entry ``method_name='current'`` for each such key
    it publishes (unless ``custom_cfg`` already has one for it), so the log shows the statistics of the last interval
    (e.g. the true ``max`` of the loss), not a mean of past maxima.

    Values reported while a validation or test loop runs are kept apart (the
    hook sets :func:`mmstats.stats.phase` to ``'val'``/``'test'``, which
    prefixes reported names with ``val/``) and published when that loop
    ends as ``val/<prefix>/val/<name>/<stat>`` (``test/...``), in the same
    log line as the metrics. mmengine strips the mode from logged keys, so
    they appear as ``<prefix>/val/<name>/<stat>``: never confused with the
    training statistics of the same name.

    Args:
        interval (int, optional): Publish every ``interval`` iterations.
            None: the LoggerHook's interval (10 without a LoggerHook).
            Ignored with ``by_epoch=True``. Defaults to None.
        by_epoch (bool): One summary per epoch instead. Defaults to False.
        regex (str): Only names matching it (``re.fullmatch``) are published.
            Defaults to ``'.*'``.
        stats (Sequence[str]): Statistics to publish, from ``'num'``,
            ``'mean'``, ``'std'``, ``'min'``, ``'max'``, ``'nonfinite'``.
            Defaults to ``('mean', 'std', 'min', 'max')``.
        prefix (str): Prefix of the published names. Defaults to
            ``'stats'``.
        collect_outputs (bool): Also report the losses that ``train_step``
            returns, so the log shows their all-rank statistics, not rank
            0's. Defaults to True.
        keep_previous (bool): Keep a name's previous values when it got no
            new ones. Defaults to True.
    """

    priority = 'NORMAL'  # before LoggerHook (BELOW_NORMAL)

    def __init__(self,
                 interval: Optional[int] = None,
                 by_epoch: bool = False,
                 regex: str = '.*',
                 stats: Sequence[str] = ('mean', 'std', 'min', 'max'),
                 prefix: str = 'stats',
                 collect_outputs: bool = True,
                 keep_previous: bool = True) -> None:
        if interval is not None and (not isinstance(interval, int) or
                                     isinstance(interval, bool)
                                     or interval <= 0):
            raise ValueError('StatsCollectorHook: interval must be None (the '
                             f'LoggerHook interval) or a positive int, got '
                             f'{interval!r}')
        for name, flag in (('by_epoch', by_epoch), ('collect_outputs',
                                                    collect_outputs),
                           ('keep_previous', keep_previous)):
            if not isinstance(flag, bool):
                raise TypeError(f'StatsCollectorHook: {name} must be a bool, '
                                f'got {flag!r}')
        if isinstance(stats, str) or not set(stats) <= set(STAT_NAMES) or \
                not stats:
            raise ValueError(f'StatsCollectorHook: stats must be a non-empty '
                             f'list of {STAT_NAMES}, got {stats!r}')
        if not isinstance(prefix, str) or not prefix:
            raise ValueError('StatsCollectorHook: prefix must be a non-empty '
                             f'str, got {prefix!r}')
        try:
            re.compile(regex)
        except (re.error, TypeError) as e:
            raise ValueError(f'StatsCollectorHook: regex {regex!r} is not a '
                             f'valid regular expression: {e}') from None
        self.interval = interval
        self.by_epoch = by_epoch
        self.stats = tuple(stats)
        self.prefix = prefix
        self.collect_outputs = collect_outputs
        # one collector per phase; phase names are prefixed ('val/...')
        self.collectors = {
            'train': Collector(rf'^(?!val/|test/)(?:{regex})$',
                               keep_previous),
            'val': Collector(rf'^val/(?:{regex})$', keep_previous),
            'test': Collector(rf'^test/(?:{regex})$', keep_previous),
        }
        self._previous_phase: Optional[str] = None  # restored on leaving
        self._seen_keys: set = set()

    def before_run(self, runner) -> None:
        if self.interval is None:
            intervals = [h.interval for h in runner.hooks
                         if isinstance(h, LoggerHook)]
            self.interval = intervals[0] if intervals else DEFAULT_INTERVAL

    def publish(self, mode: str) -> Dict[str, float]:
        """Update the collector of ``mode`` (a collective on every rank) and
        return ``{'<prefix>/<name>/<stat>': value}``."""
        collector = self.collectors[mode]
        collector.update()
        scalars = {}
        for name, values in collector.as_dict().items():
            for stat in self.stats:
                value = values[stat]
                if value == value:  # skip NaN: nothing reported yet
                    scalars[f'{self.prefix}/{name}/{stat}'] = value
        return scalars

    def _to_message_hub(self, runner, mode: str, scalars: dict) -> None:
        """Store ``scalars`` as ``<mode>/<key>`` for LoggerHook to log."""
        processor = getattr(runner, 'log_processor', None)
        if not isinstance(processor, LogProcessor):
            processor = None
        for key, value in scalars.items():
            runner.message_hub.update_scalar(f'{mode}/{key}', value)
            if key in self._seen_keys:
                continue
            self._seen_keys.add(key)
            if processor is not None and re.search(
                    processor.mean_pattern, key) and not any(
                        cfg.get('data_src') == key
                        for cfg in processor.custom_cfg):  # the user's wins
                # log the interval's statistic, not a mean of past ones
                processor.custom_cfg.append(
                    dict(data_src=key, method_name='current'))

    # -- training --------------------------------------------------------
    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        if self.collect_outputs and outputs:
            for name, value in outputs.items():
                report(name, value)
        if not self.by_epoch and self.every_n_train_iters(
                runner, self.interval):
            self._to_message_hub(runner, 'train', self.publish('train'))

    def after_train_epoch(self, runner) -> None:
        if not self.by_epoch:
            return
        scalars = self.publish('train')
        for key, value in scalars.items():
            runner.message_hub.update_scalar(key, value)
        if scalars:
            runner.visualizer.add_scalars(scalars, step=runner.epoch + 1)
            runner.logger.info(f'Epoch(train) [{runner.epoch + 1}] ' +
                               '  '.join(f'{k}: {v:.6g}'
                                         for k, v in scalars.items()))

    # -- validation and test ---------------------------------------------
    def _enter(self, mode: str) -> None:
        self._previous_phase = phase(mode)

    def _leave(self, runner, mode: str) -> None:
        phase(self._previous_phase)
        self._to_message_hub(runner, mode, self.publish(mode))

    def before_val_epoch(self, runner) -> None:
        self._enter('val')

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._leave(runner, 'val')

    def before_test_epoch(self, runner) -> None:
        self._enter('test')

    def after_test_epoch(self, runner, metrics=None) -> None:
        self._leave(runner, 'test')
