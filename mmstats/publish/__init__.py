# Copyright (c) mmstats contributors. All rights reserved.
"""What the hooks share of a Runner, just below ``mmstats/hooks``: code that
reads the runner a hook passes it (its hooks, loops, loaders, message hub,
log processor and strategy) and builds no hook.

Modules: :mod:`.schedule` (``find_hook``; ``PublicationSchedule``: when
statistics are published, LoggerHook's rule), :mod:`.layout`
(``StatsLayout``: the keys of published statistics; the collectors'
patterns), :mod:`.text_line` (what a hook writes for LoggerHook's line),
:mod:`.strategies` (the strategies the hooks refuse at ``before_run``),
:mod:`.worker_loaders` (a Runner's loaders wrapped so that values reported
in DataLoader workers ride with their batch).
"""
from .layout import (HUB_HISTORY, OUTPUTS_PREFIX, NameMatch, StatsLayout,
                     collector_patterns, one_value_stats)
from .schedule import (DEFAULT_INTERVAL, PublicationSchedule, find_hook,
                       last_step_before_publication)
from .strategies import refuse_unchecked_strategy
from .text_line import (TIMING_NAMES, hub_latest, log_current_value,
                        log_own_line, report_iteration_times, write_text_line)
from .worker_loaders import WorkerBatches, enable_worker_reporting

__all__ = [
    'HUB_HISTORY', 'OUTPUTS_PREFIX', 'NameMatch', 'StatsLayout',
    'collector_patterns', 'one_value_stats', 'DEFAULT_INTERVAL',
    'PublicationSchedule', 'find_hook', 'last_step_before_publication',
    'refuse_unchecked_strategy', 'TIMING_NAMES', 'hub_latest',
    'log_current_value', 'log_own_line', 'report_iteration_times',
    'write_text_line', 'WorkerBatches', 'enable_worker_reporting'
]
