# Copyright (c) mmstats contributors. All rights reserved.
"""Precise BatchNorm: BN running statistics recomputed with frozen weights
("Rethinking 'Batch' in BatchNorm", Wu & Johnson 2021).

Modules: :mod:`.estimators` (how batch statistics combine), :mod:`.recorder`
(flat buffers behind the BN layers), :mod:`.batches` (feeding a batch),
:mod:`.layers` (which layers take part), :mod:`.update`
(:func:`update_bn_stats`).
"""
from .estimators import (ESTIMATORS, BatchAverageEstimator, Estimator,
                         PopulationEstimator)
from .layers import layers_to_update
from .update import check_args, preserve_rng_state, update_bn_stats

__all__ = [
    'update_bn_stats', 'check_args', 'layers_to_update', 'preserve_rng_state',
    'ESTIMATORS', 'Estimator', 'PopulationEstimator', 'BatchAverageEstimator'
]
