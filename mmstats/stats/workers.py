# Copyright (c) mmstats contributors. All rights reserved.
"""Values reported in DataLoader worker processes ride with their batches.

A worker is a process: nothing flows back to the main process except the
batches. :func:`enable_worker_reporting` wraps the ``collate_fn`` of a
Runner's loaders; in a worker, the wrapper reduces the values reported
while the batch was built (``Dataset.__getitem__``, transforms, collate) to
one moments row per name (and, when a collector sketches, the names'
nonzero sketch buckets) and attaches them to the batch (a dict / list
subclass with one attribute: the model sees the same keys and items).
:func:`deliver_worker_reports` pops them from the batch in the main process
and adds them to the store, once. See ``docs/reporting.md``.
"""
import os
import warnings
from typing import Any, Callable, Optional

from torch.utils.data import DataLoader, get_worker_info

from . import reporting
from .moments import NONFINITE, N
from .pending_sketches import SKETCHES

__all__ = ['enable_worker_reporting', 'deliver_worker_reports']

_WORKER_KEY = 'dataloader-worker'
_ATTR = 'mmstats_reports'


class ReportedDict(dict):
    """A collated dict batch that carries a worker's reported values."""
    mmstats_reports: Optional[tuple] = None  # (names, rows, sketch counts)


class ReportedList(list):
    """A collated list batch that carries a worker's reported values."""
    mmstats_reports: Optional[tuple] = None  # (names, rows, sketch counts)


def _dead_ref() -> None:
    return None


class WorkerReportingCollate:
    """``collate_fn`` wrapper: in a worker, attaches the values reported
    since the previous batch to the batch it returns.

    Args:
        collate_fn (Callable): The loader's collate function.
    """

    def __init__(self, collate_fn: Callable) -> None:
        self.collate_fn = collate_fn

    def __getstate__(self) -> dict:
        return dict(self.__dict__, pid=os.getpid(), sketch=SKETCHES.enabled)

    def __setstate__(self, state: dict) -> None:
        # Unpickled in another process (a spawned worker, while it starts:
        # before get_worker_info() is set): reporting, and sketching if it
        # was on in the parent, is on there, although no collector lives
        # there.
        pid, sketch = state.pop('pid', None), state.pop('sketch', False)
        self.__dict__.update(state)
        if pid != os.getpid() or get_worker_info() is not None:
            reporting.LIVE_COLLECTORS.setdefault(_WORKER_KEY, _dead_ref)
            SKETCHES.enabled = SKETCHES.enabled or sketch

    def __call__(self, samples: Any) -> Any:
        batch = self.collate_fn(samples)
        if get_worker_info() is None:  # main process: values are in STORE
            return batch
        names, rows, counts = reporting.STORE.flush_with_sketches()
        if not names:
            return batch
        payload = (names, rows, counts)
        if isinstance(batch, dict) and type(batch) in (dict, ReportedDict):
            batch = ReportedDict(batch)
        elif isinstance(batch, list) and type(batch) in (list, ReportedList):
            batch = ReportedList(batch)
        else:  # no attribute to carry them: they wait for the next batch
            _add_reports(payload, '')
            return batch
        setattr(batch, _ATTR, payload)
        return batch


def _add_reports(payload: tuple, prefix: str) -> None:
    """Add a worker's ``(names, rows, sparse counts)`` to the stores."""
    names, rows, sparse = payload
    store = reporting.STORE
    with store.lock:
        for name, row in zip(names, rows):
            if row[N] == 0 and row[NONFINITE] == 0:  # registered, no value
                store.empty.add(prefix + name)
            else:
                store.add_row(prefix + name, row.clone())
    if sparse is None or not SKETCHES.enabled:
        return
    for name, sketch in zip(names, sparse):  # host sketches: sparse
        if sketch.codes.size:
            SKETCHES.add_counts(prefix + name, sketch)


def deliver_worker_reports(data_batch: Any) -> None:
    """Add the values a worker attached to ``data_batch`` to the store (in
    the main process, under the current phase) and remove them from the
    batch, so a second call adds nothing.

    Args:
        data_batch (Any): The batch the loop is about to feed the model.
    """
    payload = getattr(data_batch, _ATTR, None)
    if payload is None:
        return
    setattr(data_batch, _ATTR, None)
    if reporting.LIVE_COLLECTORS and not reporting._SUSPENDED[0]:
        _add_reports(payload, reporting.current_phase())


def _loops(runner: Any) -> list:
    loops = []
    for attr in ('_train_loop', '_val_loop', '_test_loop'):
        loop = getattr(runner, attr, None)
        if loop is not None and not isinstance(loop, dict) and hasattr(
                loop, 'dataloader'):
            loops.append(loop)
    return loops


def enable_worker_reporting(runner: Any) -> None:
    """Make the Runner's built train/val/test loaders send the values their
    workers report with each batch (idempotent).

    A multi-process iterator that already runs with the old ``collate_fn``
    (the iteration-based train loop starts one when it is built, and
    ``persistent_workers=True`` keeps one alive) is shut down before any of
    its batches is consumed, so that the next batch comes from workers that
    use the wrapper; one already consumed from is kept (with a warning).

    Args:
        runner (Runner): The runner whose loaders to wrap.
    """
    for loop in _loops(runner):
        loader = loop.dataloader
        if not isinstance(loader, DataLoader) or isinstance(
                loader.collate_fn, WorkerReportingCollate):
            continue
        loader.collate_fn = WorkerReportingCollate(loader.collate_fn)
        if loader.num_workers > 0:
            _restart_started_iterators(loop, loader)


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
