# Copyright (c) mmstats contributors. All rights reserved.
from .precise_bn_hook import PreciseBNHook
from .stats_collector_hook import StatsCollectorHook

__all__ = ['PreciseBNHook', 'StatsCollectorHook']
