# Copyright (c) mmstats contributors. All rights reserved.
"""mmstats: exact, cheap training statistics for mmengine.

Importing the package registers its datasets, models, metrics and hooks
(in the ``mmstats`` registries and, under the same names, mmengine's root
registries) and lets ``torch.load(weights_only=True)`` read mmengine
checkpoints.
"""
from . import datasets, evaluation, models  # noqa: F401  (registration)
from .dist import scaled_all_reduce
from .hooks import PreciseBNHook, StatsCollectorHook
from .precise_bn import update_bn_stats
from .stats import Collector, report, report0
from .utils import allow_mmengine_checkpoints
from .version import __version__

allow_mmengine_checkpoints()

__all__ = [
    '__version__', 'report', 'report0', 'Collector', 'scaled_all_reduce',
    'update_bn_stats', 'PreciseBNHook', 'StatsCollectorHook'
]
