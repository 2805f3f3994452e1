# Copyright (c) mmstats contributors. All rights reserved.
"""Throughput of training: what ``ThroughputHook`` publishes, without a
Runner.

Modules: :mod:`.flops` (the FLOPs of one iteration, counted once, and the
peak FLOP/s MFU is measured against), :mod:`.memory` (this process's peak
memory), :mod:`.interval` (the rows of a data batch and one interval's
figures over all ranks in one collective), :mod:`.figures` (one rank's
interval and the published figures: rates, peaks, FLOP/s, MFU, from plain
numbers). ``docs/throughput.md``.
"""
from .figures import Figures, ThroughputInterval, interval_flops
from .flops import PEAK_FLOPS, IterationFlops, peak_flops
from .interval import batch_rows, combine_rows, reduce_interval
from .memory import MemoryReader

__all__ = [
    'PEAK_FLOPS', 'IterationFlops', 'peak_flops', 'batch_rows',
    'reduce_interval', 'combine_rows', 'MemoryReader', 'Figures',
    'ThroughputInterval', 'interval_flops'
]
