# Copyright (c) mmstats contributors. All rights reserved.
"""Exact, cheap training statistics across ranks.

``report(name, value)`` records values from anywhere without a host-device
sync and without communicating; ``Collector.update()`` publishes, per name,
the exact statistics of everything reported since that collector's previous
update, over all ranks::

    collector = Collector(regex='loss.*')
    for batch in loader:
        loss = report('loss', criterion(model(batch)))
        ...
        if step % interval == 0:
            collector.update()          # collective on all ranks
            print(collector.as_dict())  # {'loss': {'num': .., 'mean': ..}}

Modules, in the order a value passes them (``docs/architecture.md``):
:mod:`.reporting` (``report``, ``report0``, ``phase``, compiled code, and
``REPORTER``, the one process-wide object of the report side) ->
:mod:`.pending` (value checks, per-thread pending stores, pending sketch
counts) -> :mod:`.collector` (``Collector``) -> :mod:`.protocol` (the
cross-rank reduction and its collectives); :mod:`.workers` (values from
DataLoader workers ride with their batches); pure kernels: :mod:`.moments`,
:mod:`.sketch` (quantile sketches) and :mod:`.sketch_sum` (their exchange).
What reads the published statistics (spikes, histograms) is
:mod:`mmstats.health`.
"""
from .collector import STAT_NAMES, Collector
from .reporting import (REPORTER, phase, report, report0, reset,
                        suspend_reporting)

__all__ = [
    'report', 'report0', 'phase', 'suspend_reporting', 'reset', 'Collector',
    'STAT_NAMES', 'REPORTER'
]
