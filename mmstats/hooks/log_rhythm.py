# Copyright (c) mmstats contributors. All rights reserved.
"""Helpers of StatsCollectorHook and ModuleStatsHook: when mmengine's
LoggerHook writes a training line and when statistics are published, inline
regex flags, and every rank's iteration times and the slowest rank.

StatsCollectorHook publishes exactly where LoggerHook logs, so that a log
line always shows the statistics of the iterations it covers (see
``docs/logging.md``).
"""
import re
from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist
from mmengine.dist import get_comm_device, get_rank, get_world_size
from mmengine.hooks import LoggerHook
from mmengine.optim import OptimWrapper
from mmengine.runner import EpochBasedTrainLoop, LogProcessor

from mmstats.stats import report

_GLOBAL_FLAGS = re.compile(r'\(\?([aiLmsux]+)\)')


def find_logger_hook(runner) -> Optional[LoggerHook]:
    """The runner's LoggerHook, or None."""
    for hook in runner.hooks:
        if isinstance(hook, LoggerHook):
            return hook
    return None


def logs_train_line(runner, batch_idx: int, interval: int,
                    ignore_last: bool) -> bool:
    """Whether LoggerHook (with ``interval``, ``ignore_last``) writes a
    training line after iteration ``batch_idx``.

    The same rule as ``LoggerHook.after_train_iter``: every ``interval``
    inner iterations (``batch_idx`` is the index within the epoch for
    EpochBasedTrainLoop, the global iteration for IterBasedTrainLoop), and
    at the last iteration of an epoch unless ``ignore_last`` and the epoch
    is longer than the interval.
    """
    if (batch_idx + 1) % interval == 0:
        return True
    loader = runner.train_dataloader
    return batch_idx + 1 == len(loader) and (not ignore_last
                                             or len(loader) <= interval)


def epoch_ends_after(runner, batch_idx: int) -> bool:
    """Whether training iteration ``batch_idx`` is the last of an epoch
    (EpochBasedTrainLoop only)."""
    return (isinstance(runner.train_loop, EpochBasedTrainLoop)
            and batch_idx + 1 == len(runner.train_dataloader))


def train_publication(runner, batch_idx: int, interval: int,
                      logger: Optional[LoggerHook]) -> Tuple[bool, bool]:
    """StatsCollectorHook's rule for training iteration ``batch_idx``.

    Returns:
        tuple[bool, bool]: Whether the statistics are published after it
        (where ``logger`` writes a training line, every ``interval``
        iterations, at the end of every epoch), and whether ``logger``
        writes a line there.
    """
    logged = logger is not None and logs_train_line(
        runner, batch_idx, logger.interval, logger.ignore_last)
    publishes = (
        logged or logs_train_line(runner, batch_idx, interval, True)
        or epoch_ends_after(runner, batch_idx))
    return publishes, logged


def last_step_before_publication(runner, batch_idx: int,
                                 optim_wrapper: OptimWrapper,
                                 publishes_after: Callable[[object, int],
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
    counts = optim_wrapper._accumulative_counts
    if isinstance(runner.train_loop, EpochBasedTrainLoop):
        last = len(runner.train_dataloader) - 1  # always publishes
        if batch_idx + counts - 1 >= last:
            return True
    return any(
        publishes_after(runner, batch_idx + ahead) for ahead in range(counts))


def log_current_value(processor: LogProcessor, key: str) -> None:
    """Make ``processor`` log the current value of ``key``.

    LogProcessor averages keys matching its ``mean_pattern`` (``loss``,
    ``time``, ...) over ``window_size`` past values, which would make a
    line show a mean of past maxima; a ``custom_cfg`` entry of the user's
    for ``key`` wins.
    """
    if re.search(processor.mean_pattern, key) and not any(
            cfg.get('data_src') == key for cfg in processor.custom_cfg):
        processor.custom_cfg.append(dict(data_src=key, method_name='current'))


def scope_inline_flags(regex: str) -> str:
    """Turn leading global inline flags into scoped ones.

    ``'(?i)loss'`` becomes ``'(?i:loss)'``, so the pattern can be embedded
    in a larger one (Python rejects global flags that are not at the start
    of the whole pattern).
    """
    match = _GLOBAL_FLAGS.match(regex)
    if match is None:
        return regex
    return f'(?{match.group(1)}:{regex[match.end():]})'


def report_iteration_times(runner) -> float:
    """Report this rank's ``time`` and ``data_time`` of the iteration that
    just ended (IterTimerHook's, from the message hub) under those names;
    return the ``data_time`` (0 if there is none)."""
    data_time = 0.0
    for key in ('time', 'data_time'):
        buffer = runner.message_hub.log_scalars.get(f'train/{key}')
        if buffer is not None:
            value = float(buffer.current())
            report(key, value)
            if key == 'data_time':
                data_time = value
    return data_time


def slowest_rank(seconds: float) -> Optional[int]:
    """The rank whose ``seconds`` is the largest (the lowest such rank on a
    tie, at microsecond resolution), the same on every rank; None without
    distribution.

    One 1-element int64 all_reduce MAX of ``microseconds * world + (world -
    1 - rank)``: the cost does not grow with the world size.
    """
    world = get_world_size()
    if world == 1:
        return None
    key = int(round(seconds * 1e6)) * world + (world - 1 - get_rank())
    largest = torch.tensor([key], dtype=torch.int64, device=get_comm_device())
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return world - 1 - int(largest) % world
