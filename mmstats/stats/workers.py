# Copyright (c) mmstats contributors. All rights reserved.
"""Values reported in DataLoader worker processes ride with their batches.

A worker is a process: nothing flows back to the main process except the
batches. :class:`WorkerReportingCollate` wraps a loader's ``collate_fn``
(``mmstats.publish.worker_loaders`` does it for a Runner's loaders); in a
worker, the wrapper reduces the values reported
while the batch was built (``Dataset.__getitem__``, transforms, collate) to
one moments row per name (and, when a collector sketches, the names'
nonzero sketch buckets) and attaches them to the batch (a dict / list
subclass with one attribute: the model sees the same keys and items).
:func:`deliver_worker_reports` pops them from the batch in the main process
and adds them to the store, once. See ``docs/reporting.md``.
"""
import multiprocessing
import os
from multiprocessing.context import get_spawning_popen
from typing import Any, Callable, Optional

from torch.utils.data import get_worker_info

from .pending import Flush
from .reporting import REPORTER

__all__ = [
    'WorkerReportingCollate', 'deliver_worker_reports', 'carries_reports'
]

_ATTR = 'mmstats_reports'


class ReportedDict(dict):
    """A collated dict batch that carries a worker's reported values.

    Example:
        >>> batch = ReportedDict(img=[1, 2])  # the same keys and items
        >>> batch['img'], batch.mmstats_reports, carries_reports(batch)
        ([1, 2], None, True)
    """
    mmstats_reports: Optional[Flush] = None  # counts sparse


class ReportedList(list):
    """A collated list batch that carries a worker's reported values.

    Example:
        >>> batch = ReportedList([1, 2])  # the same items
        >>> batch == [1, 2], batch.mmstats_reports, carries_reports(batch)
        (True, None, True)
    """
    mmstats_reports: Optional[Flush] = None  # counts sparse


class WorkerReportingCollate:
    """``collate_fn`` wrapper: in a worker, attaches the values reported
    since the previous batch to the batch it returns.

    Args:
        collate_fn (Callable): The loader's collate function.

    Example:
        >>> collate = WorkerReportingCollate(lambda samples: {'x': samples})
        >>> collate([1, 2])  # main process: the batch as is
        {'x': [1, 2]}
        >>> collate.dropped_batches
        0
    """

    def __init__(self, collate_fn: Callable) -> None:
        self.collate_fn = collate_fn
        # Batches whose reported values were dropped because the batch type
        # cannot carry them, counted by the workers in shared memory (the
        # main process warns, see ``dropped_batches``).
        self._dropped = multiprocessing.RawValue('q', 0)

    @property
    def dropped_batches(self) -> int:
        """Batches whose workers' values could not ride with them."""
        return self._dropped.value if self._dropped is not None else 0

    def __getstate__(self) -> dict:
        state = dict(
            self.__dict__, pid=os.getpid(), sketch=REPORTER.sketches.enabled)
        if get_spawning_popen() is None:  # shared memory only for a worker
            state['_dropped'] = None
        return state

    def __setstate__(self, state: dict) -> None:
        # Unpickled in another process (a spawned worker, while it starts:
        # before get_worker_info() is set): reporting, and sketching if it
        # was on in the parent, is on there, although no collector lives
        # there.
        pid, sketch = state.pop('pid', None), state.pop('sketch', False)
        self.__dict__.update(state)
        if pid != os.getpid() or get_worker_info() is not None:
            REPORTER.enable_in_worker(sketch)

    def __call__(self, samples: Any) -> Any:
        batch = self.collate_fn(samples)
        if get_worker_info() is None:  # main process: values are in STORE
            return batch
        flushed = REPORTER.take()
        if not flushed.names:
            return batch
        payload = flushed  # host sketches are sparse already
        if isinstance(batch, dict) and type(batch) in (dict, ReportedDict):
            batch = ReportedDict(batch)
        elif isinstance(batch, list) and type(batch) in (list, ReportedList):
            batch = ReportedList(batch)
        else:  # no attribute to carry them (tuple, custom class)
            if self._dropped is not None:
                self._dropped.value += 1  # the main process warns
            return batch
        setattr(batch, _ATTR, payload)
        return batch


def carries_reports(data_batch: Any) -> bool:
    """Whether a batch of this type can carry a worker's reported values
    (dicts and lists can; tuples and other classes cannot).

    Example:
        >>> [carries_reports(b) for b in ({'x': 1}, [1], (1, ))]
        [True, True, False]
    """
    return isinstance(
        data_batch, (dict, list)) and type(data_batch) in (dict, ReportedDict,
                                                           list, ReportedList)


def deliver_worker_reports(data_batch: Any) -> None:
    """Add the values a worker attached to ``data_batch`` to the store (in
    the main process, under the current phase) and remove them from the
    batch, so a second call adds nothing.

    Args:
        data_batch (Any): The batch the loop is about to feed the model.

    Example:
        >>> from mmstats import Collector, report
        >>> collector = Collector()
        >>> _ = report('aug', [1.0, 3.0])  # as if in a worker, whose
        >>> batch = ReportedDict(x=1)  # collate_fn attaches them:
        >>> batch.mmstats_reports = REPORTER.take()
        >>> deliver_worker_reports(batch)
        >>> collector.update()
        >>> batch.mmstats_reports, collector.mean('aug')
        (None, 2.0)
    """
    payload = getattr(data_batch, _ATTR, None)
    if payload is None:
        return
    setattr(data_batch, _ATTR, None)
    REPORTER.add_flush(payload, REPORTER.phase)
