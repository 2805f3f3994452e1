# Copyright (c) mmstats contributors. All rights reserved.
from .module_stats_hook import ModuleStatsHook
from .precise_bn_hook import PreciseBNHook
from .stats_collector_hook import StatsCollectorHook
from .throughput_hook import ThroughputHook

__all__ = [
    'ModuleStatsHook', 'PreciseBNHook', 'StatsCollectorHook', 'ThroughputHook'
]
