# Copyright (c) mmstats contributors. All rights reserved.
"""What the three hooks share of a Runner: its other hooks
(:func:`find_hook`) and when training statistics are published
(:class:`PublicationSchedule`: built once per run, on mmengine's own
``Hook.every_n_inner_iters`` and ``Hook.end_of_epoch``).

StatsCollectorHook publishes exactly where LoggerHook logs, so that a log
line always shows the statistics of the iterations it covers (see
``docs/logging.md``); ModuleStatsHook arms its probes on the same
iterations, PreciseBNHook puts its values on the line LoggerHook writes.
"""
from __future__ import annotations
from typing import TYPE_CHECKING, Callable, Optional, Type, TypeVar

from mmengine.hooks import Hook, LoggerHook

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.optim import OptimWrapper
    from mmengine.runner import Runner

__all__ = [
    'DEFAULT_INTERVAL', 'find_hook', 'PublicationSchedule',
    'last_step_before_publication'
]

#: the publication interval without an ``interval`` and a LoggerHook
DEFAULT_INTERVAL = 10

HookT = TypeVar('HookT', bound=Hook)

# mmengine's iteration helpers; they read nothing of the hook they are on
_HOOK = Hook()


def find_hook(runner: Runner,
              hook_type: Type[HookT],
              ready: Optional[str] = None) -> Optional[HookT]:
    """The first hook of ``runner`` that is a ``hook_type`` (and, with
    ``ready``, has that attribute already), or None.

    Example:
        >>> from types import SimpleNamespace
        >>> from mmengine.hooks import EMAHook, LoggerHook
        >>> runner = SimpleNamespace(hooks=[LoggerHook(interval=5)])
        >>> find_hook(runner, LoggerHook).interval
        5
        >>> find_hook(runner, EMAHook) is None
        True
    """
    for hook in runner.hooks:
        if isinstance(hook, hook_type) and (ready is None
                                            or hasattr(hook, ready)):
            return hook
    return None


class PublicationSchedule:
    """When the training statistics are published, and when the runner's
    LoggerHook writes a training line; built once per run, asked with the
    training iteration's ``batch_idx`` (the index within the epoch for an
    ``EpochBasedTrainLoop``, the global iteration for an
    ``IterBasedTrainLoop``, as mmengine's hooks get it).

    Publications fall where LoggerHook writes a line, every ``interval``
    inner iterations, at the end of every epoch and (``at_last_iter``)
    after the last iteration of an iteration-based run; with ``by_epoch``
    at the end of every epoch only.

    Args:
        runner (Runner): The runner (its LoggerHook is looked up once).
        interval (int, optional): Publish every ``interval`` inner
            iterations. None: the LoggerHook's interval
            (:data:`DEFAULT_INTERVAL` without one). Defaults to None.
        by_epoch (bool): Only at the end of every epoch. Defaults to False.
        at_last_iter (bool): Also after the last iteration of an
            iteration-based run. Defaults to True.

    Attributes:
        logger (LoggerHook, optional): The runner's LoggerHook.
        interval (int): The interval in use.

    Example:
        >>> from types import SimpleNamespace
        >>> from unittest.mock import MagicMock
        >>> from mmengine.hooks import LoggerHook
        >>> from mmengine.runner import EpochBasedTrainLoop
        >>> runner = SimpleNamespace(
        ...     hooks=[LoggerHook(interval=4)], train_dataloader=[None] * 10,
        ...     train_loop=MagicMock(spec=EpochBasedTrainLoop))
        >>> schedule = PublicationSchedule(runner, interval=3)
        >>> [i for i in range(10) if schedule.publishes_after(runner, i)]
        [2, 3, 5, 7, 8, 9]
        >>> [i for i in range(10) if schedule.logs_after(runner, i)]
        [3, 7]
    """

    def __init__(self,
                 runner: Runner,
                 interval: Optional[int] = None,
                 by_epoch: bool = False,
                 at_last_iter: bool = True) -> None:
        self.logger: Optional[LoggerHook] = find_hook(runner, LoggerHook)
        if interval is None:
            interval = (
                self.logger.interval if self.logger else DEFAULT_INTERVAL)
        self.interval = interval
        self.by_epoch = by_epoch
        self.at_last_iter = at_last_iter

    def logs_after(self, runner: Runner, batch_idx: int) -> bool:
        """Whether the LoggerHook writes a training line after iteration
        ``batch_idx`` (False without one)."""
        return self.logger is not None and logs_train_line(
            runner, batch_idx, self.logger.interval, self.logger.ignore_last)

    def publishes_after(self, runner: Runner, batch_idx: int) -> bool:
        """Whether the statistics are published after training iteration
        ``batch_idx`` (also one ahead of ``runner.iter``)."""
        if self.by_epoch:
            return self.ends_epoch(runner, batch_idx)
        return (self.logs_after(runner, batch_idx)
                or logs_train_line(runner, batch_idx, self.interval, True)
                or self.ends_epoch(runner, batch_idx)
                or (self.at_last_iter and self.ends_run(runner, batch_idx)))

    @staticmethod
    def ends_epoch(runner: Runner, batch_idx: int) -> bool:
        """Whether training iteration ``batch_idx`` is the last of an epoch
        (``EpochBasedTrainLoop`` only)."""
        from mmengine.runner import EpochBasedTrainLoop
        return (isinstance(runner.train_loop, EpochBasedTrainLoop)
                and _HOOK.end_of_epoch(runner.train_dataloader, batch_idx))

    @staticmethod
    def ends_run(runner: Runner, batch_idx: int) -> bool:
        """Whether ``batch_idx`` is the last iteration of an
        ``IterBasedTrainLoop`` run: ``Hook.is_last_train_iter`` for any
        iteration, not only ``runner.iter`` (``batch_idx`` is the global
        iteration there)."""
        from mmengine.runner import IterBasedTrainLoop
        return (isinstance(runner.train_loop, IterBasedTrainLoop)
                and batch_idx + 1 == runner.max_iters)


def logs_train_line(runner: Runner, batch_idx: int, interval: int,
                    ignore_last: bool) -> bool:
    """Whether a LoggerHook with ``interval`` and ``ignore_last`` writes a
    training line after iteration ``batch_idx``.

    The rule of ``LoggerHook.after_train_iter``, on the same
    ``Hook.every_n_inner_iters`` and ``Hook.end_of_epoch``: every
    ``interval`` inner iterations, and at the last iteration of an epoch
    unless ``ignore_last`` and the epoch is longer than the interval.

    Example:
        >>> from types import SimpleNamespace
        >>> runner = SimpleNamespace(train_dataloader=[None] * 10)
        >>> [i for i in range(10) if logs_train_line(runner, i, 4, False)]
        [3, 7, 9]
    """
    if _HOOK.every_n_inner_iters(batch_idx, interval):
        return True
    loader = runner.train_dataloader
    return _HOOK.end_of_epoch(
        loader, batch_idx) and (not ignore_last or len(loader) <= interval)


def last_step_before_publication(runner: Runner, batch_idx: int,
                                 optim_wrapper: OptimWrapper,
                                 publishes_after: Callable[[Runner, int],
                                                           bool]) -> bool:
    """Whether the optimizer steps in training iteration ``batch_idx`` and
    it is the last step up to a publication (gradient accumulation: a
    publication within the next ``accumulative_counts`` iterations).

    Args:
        publishes_after (Callable): ``(runner, batch_idx) -> bool``, the
            publication rule.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> from mmengine.optim import OptimWrapper
        >>> sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1)
        >>> wrapper = OptimWrapper(sgd, accumulative_counts=4)
        >>> runner = SimpleNamespace(train_loop=None)
        >>> every_5th = lambda runner, i: i % 5 == 4
        >>> wrapper._inner_count = 3  # the 4th iteration: a step
        >>> last_step_before_publication(runner, 3, wrapper, every_5th)
        True
        >>> wrapper._inner_count = 1  # no step in the 2nd iteration
        >>> last_step_before_publication(runner, 1, wrapper, every_5th)
        False
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
