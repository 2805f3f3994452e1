# Copyright (c) mmstats contributors. All rights reserved.
"""Helpers of StatsCollectorHook: when mmengine's LoggerHook writes a
training line, inline regex flags, and the slowest rank of an interval.

StatsCollectorHook publishes exactly where LoggerHook logs, so that a log
line always shows the statistics of the iterations it covers (see
``docs/logging.md``).
"""
import re
from typing import Optional

import torch
import torch.distributed as dist
from mmengine.dist import get_comm_device, get_rank, get_world_size
from mmengine.hooks import LoggerHook

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


def slowest_rank(seconds: float) -> Optional[int]:
    """The rank whose ``seconds`` is the largest (the lowest such rank on a
    tie), the same on every rank; None without distribution.

    Two 1-element all_reduces (MAX of the times, then MIN of the ranks that
    hold it): the cost does not grow with the world size.
    """
    world = get_world_size()
    if world == 1:
        return None
    device = get_comm_device()
    mine = torch.tensor([seconds], dtype=torch.float64, device=device)
    largest = mine.clone()
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    candidate = get_rank() if bool(mine == largest) else world
    rank = torch.tensor([candidate], device=device)
    dist.all_reduce(rank, op=dist.ReduceOp.MIN)
    return int(rank)
