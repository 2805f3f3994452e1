# Copyright (c) mmstats contributors. All rights reserved.
from .stats_collector_hook import StatsCollectorHook

__all__ = ['StatsCollectorHook']
