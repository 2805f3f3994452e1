# Copyright (c) mmstats contributors. All rights reserved.
"""Values reported in DataLoader workers, the Runner side: wrap the
``collate_fn`` of a Runner's train/val/test loaders so that what workers
report rides with each batch (:func:`enable_worker_reporting`), and
deliver it when the loop takes the batch (:class:`WorkerBatches`).

A multi-process iterator that already runs with the old ``collate_fn`` is
restarted here: ``loader._iterator`` (``persistent_workers=True``) and the
iteration-based loop's infinite iterator are shut down before they yield,
and mmengine's ``InfiniteSampler`` gets a fresh index generator
(``_indices_of_rank``), so the restarted stream is the one the first would
have been. The worker side is :mod:`mmstats.stats.workers`.
"""
from __future__ import annotations
import logging
import warnings
from typing import TYPE_CHECKING, Any, List

from mmengine.logging import print_log
from torch.utils.data import DataLoader

from mmstats.stats.workers import (WorkerReportingCollate, carries_reports,
                                   deliver_worker_reports)

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['enable_worker_reporting', 'WorkerBatches']


def _loops(runner: Runner) -> list:
    loops = []
    for attr in ('_train_loop', '_val_loop', '_test_loop'):
        loop = getattr(runner, attr, None)
        if loop is not None and not isinstance(loop, dict) and hasattr(
                loop, 'dataloader'):
            loops.append(loop)
    return loops


def enable_worker_reporting(runner: Runner) -> List[WorkerReportingCollate]:
    """Make the Runner's built train/val/test loaders send the values their
    workers report with each batch (idempotent).

    A multi-process iterator that already runs with the old ``collate_fn``
    (the iteration-based train loop starts one when it is built, and
    ``persistent_workers=True`` keeps one alive) is shut down before any of
    its batches is consumed, so that the next batch comes from workers that
    use the wrapper; one already consumed from is kept (with a warning).

    Args:
        runner (Runner): The runner whose loaders to wrap.

    Returns:
        list[WorkerReportingCollate]: The wrappers of the loaders that use
        worker processes.

    Example:
        >>> from types import SimpleNamespace
        >>> from torch.utils.data import DataLoader
        >>> loop = SimpleNamespace(dataloader=DataLoader(range(4)))
        >>> runner = SimpleNamespace(_train_loop=loop)
        >>> enable_worker_reporting(runner)  # no worker processes
        []
        >>> type(loop.dataloader.collate_fn).__name__
        'WorkerReportingCollate'
    """
    with_workers = []
    for loop in _loops(runner):
        loader = loop.dataloader
        if not isinstance(loader, DataLoader):
            continue
        if not isinstance(loader.collate_fn, WorkerReportingCollate):
            loader.collate_fn = WorkerReportingCollate(loader.collate_fn)
            if loader.num_workers > 0:
                _restart_started_iterators(loop, loader)
        if loader.num_workers > 0:
            with_workers.append(loader.collate_fn)
    return with_workers


class WorkerBatches:
    """Deliver the values workers attached to each batch, and warn once when
    workers had to drop values because their batch type cannot carry them
    (a ``collate_fn`` that returns a tuple or a custom class).

    Args:
        owner (str): Who warns. Defaults to 'StatsCollectorHook'.

    Example:
        >>> batches = WorkerBatches()
        >>> batches.deliver({'inputs': [1, 2]})  # no loader wrapped: no-op
    """

    def __init__(self, owner: str = 'StatsCollectorHook') -> None:
        self.owner = owner
        self._collates: List[WorkerReportingCollate] = []
        self._warned = False

    def enable(self, runner: Runner) -> None:
        """Wrap the runner's loaders (call when a loop starts)."""
        for collate in enable_worker_reporting(runner):
            if collate not in self._collates:
                self._collates.append(collate)

    def deliver(self, data_batch: Any) -> None:
        """Add the values that came with ``data_batch`` to the store."""
        if carries_reports(data_batch):
            deliver_worker_reports(data_batch)
        elif not self._warned and self._collates and any(
                c.dropped_batches for c in self._collates):
            self._warn(type(data_batch).__qualname__)

    def _warn(self, kind: str) -> None:
        self._warned = True
        print_log(
            f'{self.owner}: values reported in DataLoader workers cannot '
            f'ride with batches of type {kind} (only dict and list batches '
            'carry them), so they are dropped; return a dict or a list from '
            'collate_fn, or report those values in the main process',
            'current',
            level=logging.WARNING)


def _restart_started_iterators(loop: Any, loader: DataLoader) -> None:
    infinite = getattr(loop, 'dataloader_iterator', None)
    started = getattr(infinite, '_iterator', None)
    persistent = getattr(loader, '_iterator', None)
    for iterator in {
            id(it): it
            for it in (started, persistent) if it is not None
    }.values():
        if getattr(iterator, '_num_yielded', 0) > 0:
            warnings.warn('mmstats: a DataLoader iterator already yielded '
                          'batches; values reported in its workers are lost '
                          'until it is restarted')
            continue
        shutdown = getattr(iterator, '_shutdown_workers', None)
        if shutdown is not None:
            shutdown()
        if loader._iterator is iterator:
            loader._iterator = None
        if started is iterator:
            _rewind_infinite_sampler(loader)
            infinite._iterator = iter(loader)


def _rewind_infinite_sampler(loader: DataLoader) -> None:
    """mmengine's InfiniteSampler shares one index generator between its
    iterators (and closing the old one closes it): start a new one, so the
    restarted iterator yields the same stream as the first would have."""
    sampler = getattr(loader.batch_sampler, 'sampler', loader.sampler)
    if hasattr(sampler, '_indices_of_rank') and hasattr(sampler, 'indices'):
        sampler.indices = sampler._indices_of_rank()
