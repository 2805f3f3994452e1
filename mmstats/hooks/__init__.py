# Copyright (c) mmstats contributors. All rights reserved.
from .checkpoint_hook import CheckpointHook
from .hang_watch_hook import HangWatchHook
from .module_stats_hook import ModuleStatsHook
from .precise_bn_hook import PreciseBNHook
from .random_state_hook import RandomStateHook
from .stats_collector_hook import StatsCollectorHook
from .throughput_hook import ThroughputHook

__all__ = [
    'CheckpointHook', 'HangWatchHook', 'ModuleStatsHook', 'PreciseBNHook',
    'RandomStateHook', 'StatsCollectorHook', 'ThroughputHook'
]
