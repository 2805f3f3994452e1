# Copyright (c) mmstats contributors. All rights reserved.
"""What any hook writes for LoggerHook's text line: the latest value of a
key in the message hub (:func:`hub_latest`), LogProcessor told to show it
as it is (:func:`log_current_value`, :func:`write_text_line`: shared by
StatsCollectorHook's layout and ThroughputHook), a line of the hook's own
(:func:`log_own_line`), and the iteration's ``time`` and ``data_time``
reported from the message hub (:func:`report_iteration_times`).

It reads what a hook passes it (``runner.message_hub``,
``runner.log_processor``, ``runner.logger``) and builds no hook.
"""
from __future__ import annotations
import re
from typing import TYPE_CHECKING, Any, Dict, Optional, Set

from mmengine.logging import HistoryBuffer, MessageHub

from mmstats.stats import report

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import LogProcessor

__all__ = [
    'hub_latest', 'log_current_value', 'write_text_line', 'log_own_line',
    'report_iteration_times', 'TIMING_NAMES'
]

TIMING_NAMES = ('time', 'data_time')  # the log line shows their max


def report_iteration_times(hub: MessageHub) -> float:
    """Report this rank's ``time`` and ``data_time`` of the iteration that
    just ended (IterTimerHook's, from the message hub) under those names;
    return the ``data_time`` (0 if there is none).

    Example:
        >>> from mmengine.logging import MessageHub
        >>> hub = MessageHub('report_iteration_times_example')
        >>> hub.update_scalar('train/data_time', 0.25)
        >>> report_iteration_times(hub)  # nothing collects: not kept
        0.25
    """
    data_time = 0.0
    for key in TIMING_NAMES:
        buffer = hub.log_scalars.get(f'train/{key}')
        if buffer is not None:
            value = float(buffer.current())
            report(key, value)
            if key == 'data_time':
                data_time = value
    return data_time


def hub_latest(hub: MessageHub, key: str, value: float) -> None:
    """Hold the latest ``value`` of ``key`` in the message hub, written in
    place (no copy; LoggerHook's line shows the current value, see
    :func:`log_current_value`); nothing goes into checkpoints.

    Example:
        >>> from mmengine.logging import MessageHub
        >>> hub = MessageHub('text_line_example')
        >>> hub_latest(hub, 'train/samples_per_s', 10.)
        >>> hub_latest(hub, 'train/samples_per_s', 12.)  # in place
        >>> hub.log_scalars['train/samples_per_s'].data[0].tolist()
        [12.0]
    """
    buffer = hub.log_scalars.get(key)
    if buffer is None or buffer.max_length != 1:
        hub.log_scalars[key] = HistoryBuffer([float(value)], [1], max_length=1)
    else:
        buffer.data[0][0] = value


def log_current_value(processor: LogProcessor, key: str) -> None:
    """Make ``processor`` log the current value of ``key``.

    LogProcessor averages keys matching its ``mean_pattern`` (``loss``,
    ``time``, ...) over ``window_size`` past values, which would make a
    line show a mean of past maxima; a ``custom_cfg`` entry of the user's
    for ``key`` wins.

    Example:
        >>> from mmengine.runner import LogProcessor
        >>> processor = LogProcessor()
        >>> log_current_value(processor, 'stats/loss/max')
        >>> processor.custom_cfg
        [{'data_src': 'stats/loss/max', 'method_name': 'current'}]
    """
    if re.search(processor.mean_pattern, key) and not any(
            cfg.get('data_src') == key for cfg in processor.custom_cfg):
        processor.custom_cfg.append(dict(data_src=key, method_name='current'))


def write_text_line(runner: Any,
                    mode: str,
                    text: Dict[str, float],
                    previous: Set[str],
                    seen: Optional[Set[str]] = None) -> Set[str]:
    """Put ``text`` into the message hub as ``<mode>/<key>`` for LoggerHook
    (the latest value, :func:`hub_latest`), take out the keys of the
    previous write (``previous``) that have no value now (the line must
    not show a stale one), and make LogProcessor show each key's current
    value (:func:`log_current_value`, once per key in ``seen`` if given).

    Returns:
        set[str]: The keys written: ``previous`` of the next write.

    Example:
        >>> from types import SimpleNamespace
        >>> from mmengine.logging import MessageHub
        >>> from mmengine.runner import LogProcessor
        >>> runner = SimpleNamespace(
        ...     message_hub=MessageHub('write_text_line_example'),
        ...     log_processor=LogProcessor())
        >>> keys = write_text_line(runner, 'train', {'loss/max': 2.}, set())
        >>> keys = write_text_line(runner, 'train', {'lr': 0.1}, keys)
        >>> sorted(runner.message_hub.log_scalars)  # loss/max left
        ['train/lr']
        >>> runner.log_processor.custom_cfg  # LogProcessor's own key
        [{'data_src': 'loss/max', 'method_name': 'current'}]
    """
    from mmengine.runner import LogProcessor
    hub = runner.message_hub
    processor = getattr(runner, 'log_processor', None)
    keys = {f'{mode}/{key}' for key in text}
    for stale in previous - keys:
        hub.log_scalars.pop(stale, None)
    for key, value in text.items():
        hub_latest(hub, f'{mode}/{key}', value)
        if seen is not None:
            if key in seen:
                continue
            seen.add(key)
        if isinstance(processor, LogProcessor):
            log_current_value(processor, key)
    return keys


def log_own_line(runner: Any, head: str, text: Dict[str, float]) -> None:
    """Log a line of the hook's own where LoggerHook writes none: ``head``
    and ``text`` in LogProcessor's number format (nothing without
    ``text``).

    Example:
        >>> from types import SimpleNamespace
        >>> from mmengine.runner import LogProcessor
        >>> lines = []
        >>> runner = SimpleNamespace(log_processor=LogProcessor(),
        ...                          logger=SimpleNamespace(info=lines.append))
        >>> log_own_line(runner, 'Epoch(train) [1]', {'loss/mean': 0.5})
        >>> lines
        ['Epoch(train) [1]  loss/mean: 0.5000']
    """
    if text:
        digits = getattr(runner.log_processor, 'num_digits', 4)
        runner.logger.info(f'{head}  ' + '  '.join(f'{k}: {v:.{digits}f}'
                                                   for k, v in text.items()))
