# Copyright (c) mmstats contributors. All rights reserved.
"""mmstats: exact, cheap training statistics for mmengine.

Importing the package registers mmstats' hooks in its own ``mmstats``
registry scope and changes nothing else (no root-registry entries, no
process-wide torch state). Resuming mmengine checkpoints under
``torch.load(weights_only=True)`` is an explicit opt-in:
:func:`mmstats.utils.allow_mmengine_checkpoints`.
"""
# first: an old torch or mmengine fails here, naming the version needed
from .utils import compat  # isort: skip  # noqa: F401
from .dist import scaled_all_reduce
from .hooks import ModuleStatsHook, PreciseBNHook, StatsCollectorHook
from .precise_bn import update_bn_stats
from .stats import Collector, report, report0
from .version import __version__

__all__ = [
    '__version__', 'report', 'report0', 'Collector', 'scaled_all_reduce',
    'update_bn_stats', 'ModuleStatsHook', 'PreciseBNHook', 'StatsCollectorHook'
]
