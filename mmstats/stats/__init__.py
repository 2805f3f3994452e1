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

Modules: :mod:`.moments` (pure kernels), :mod:`.reporting` (``report`` and
the pending store), :mod:`.collector` (``Collector`` and its cross-rank
protocol).
"""
from .collector import STAT_NAMES, Collector
from .reporting import phase, report, report0, reset, suspend_reporting

__all__ = [
    'report', 'report0', 'phase', 'suspend_reporting', 'reset', 'Collector',
    'STAT_NAMES'
]
