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
:mod:`.reporting` (``report``, ``report0``, ``phase`` and ``REPORTER``, the
one owner of the report side's state), :mod:`.values` (checks and
conversion), :mod:`.store` (per-thread pending stores) with
:mod:`.pending_sketches`, :mod:`.compile` (``report()`` in compiled code),
:mod:`.workers` (values from DataLoader workers), :mod:`.collector`
(``Collector``) over :mod:`.protocol` and :mod:`.collectives` (the
cross-rank reduction), :mod:`.moments` and :mod:`.sketch` (pure kernels).
"""
from .collector import STAT_NAMES, Collector
from .reporting import (REPORTER, phase, report, report0, reset,
                        suspend_reporting)

__all__ = [
    'report', 'report0', 'phase', 'suspend_reporting', 'reset', 'Collector',
    'STAT_NAMES', 'REPORTER'
]
