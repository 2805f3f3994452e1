# Copyright (c) mmstats contributors. All rights reserved.
"""What a hook writes for LoggerHook's text line: the latest value of a key
in the message hub, and LogProcessor told to show it as it is.

Shared by StatsCollectorHook and ThroughputHook.
"""
import re

from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner import LogProcessor

__all__ = ['hub_latest', 'log_current_value']


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
