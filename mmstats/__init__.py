# Copyright (c) mmstats contributors. All rights reserved.
"""mmstats: exact, cheap training statistics for mmengine.

Importing the package changes nothing process-wide: no root-registry
entries, no torch state (not even what importing ``mmengine.hooks`` adds to
torch's ``weights_only`` allowlist). The hooks and ``update_bn_stats`` load
on first use: a config's ``type='mmstats.X'`` imports them through the
``mmstats`` registry's locations, and ``mmstats.StatsCollectorHook`` (or
``import mmstats.hooks``) imports them here. Resuming mmengine checkpoints
under ``torch.load(weights_only=True)`` is an explicit opt-in:
:func:`mmstats.launch.allow_mmengine_checkpoints`.
"""
# first: an old torch or mmengine fails here, naming the version needed
from .utils import compat  # isort: skip  # noqa: F401
from .dist import scaled_all_reduce
from .stats import Collector, report, report0
from .utils.lazy import lazy_getattr
from .version import __version__

# loaded on first use (they import mmengine.hooks / mmengine.model)
_LAZY = {
    'CheckpointHook': '.hooks',
    'HangWatchHook': '.hooks',
    'ModuleStatsHook': '.hooks',
    'PreciseBNHook': '.hooks',
    'RandomStateHook': '.hooks',
    'StatsCollectorHook': '.hooks',
    'ThroughputHook': '.hooks',
    'update_bn_stats': '.precise_bn',
}

__all__ = [
    '__version__', 'report', 'report0', 'Collector', 'scaled_all_reduce',
    'update_bn_stats', 'CheckpointHook', 'HangWatchHook', 'ModuleStatsHook',
    'PreciseBNHook', 'RandomStateHook', 'StatsCollectorHook', 'ThroughputHook'
]

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
