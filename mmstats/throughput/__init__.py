# Copyright (c) mmstats contributors. All rights reserved.
"""Throughput of training: what ``ThroughputHook`` publishes, without a
Runner.

Modules: :mod:`.flops` (the FLOPs of one iteration, counted once, and the
peak FLOP/s MFU is measured against), :mod:`.memory` (this process's peak
memory), :mod:`.interval` (the rows of a data batch and one interval's
figures over all ranks in one collective). ``docs/throughput.md``.
"""
from .flops import PEAK_FLOPS, IterationFlops, peak_flops
from .interval import batch_rows, reduce_interval
from .memory import MemoryReader

__all__ = [
    'PEAK_FLOPS', 'IterationFlops', 'peak_flops', 'batch_rows',
    'reduce_interval', 'MemoryReader'
]
