# Copyright (c) mmstats contributors. All rights reserved.
"""Precise BatchNorm: BN running statistics recomputed with frozen weights
("Rethinking 'Batch' in BatchNorm", Wu & Johnson 2021).

Modules: :mod:`.estimators` (how batch statistics combine), :mod:`.recorder`
(flat buffers behind the BN layers), :mod:`.batches` (feeding a batch),
:mod:`.layers` (which layers take part), :mod:`.update`
(:func:`update_bn_stats`); for a caller such as ``PreciseBNHook``:
:mod:`.loader` (the loader a recomputation reads) and :mod:`.ema` (the EMA
copy's statistics and modes beside the model's).
"""
from .ema import BN_STATISTICS, mirror_modes, swap_bn_statistics
from .estimators import (ESTIMATORS, BatchAverageEstimator, Estimator,
                         PopulationEstimator)
from .layers import layers_to_update
from .loader import check_loader_cfg, loader_from_cfg, loader_like
from .update import check_args, preserve_rng_state, update_bn_stats

__all__ = [
    'update_bn_stats', 'check_args', 'layers_to_update', 'preserve_rng_state',
    'ESTIMATORS', 'Estimator', 'PopulationEstimator', 'BatchAverageEstimator',
    'check_loader_cfg', 'loader_from_cfg', 'loader_like', 'swap_bn_statistics',
    'mirror_modes', 'BN_STATISTICS'
]
