# Copyright (c) mmstats contributors. All rights reserved.
"""How per-batch BN statistics combine into population statistics.

A BN layer's call on a batch gives per channel the batch mean ``mu_b``, the
unbiased batch variance ``v_b`` and ``n_b = numel / C`` values. The recorder
accumulates, in float64, ``sum(w_mean * mu_b)`` and ``sum(w_var * v_b)`` (plus
``sum(n_b * mu_b^2)`` for estimators that need it) with per-call weights
from :meth:`Estimator.weights`; :meth:`Estimator.finalize` turns the sums into
the running mean and variance.
"""
from typing import Dict, Tuple, Type

from torch import Tensor

__all__ = [
    'Estimator', 'PopulationEstimator', 'BatchAverageEstimator', 'ESTIMATORS'
]


class Estimator:
    """Base class: per-call weights and the final formula."""

    #: whether the second accumulator also gets ``n_b * mu_b^2``
    needs_squares = False

    @staticmethod
    def weights(n: int) -> Tuple[float, float]:
        """``(w_mean, w_var)`` of one call with ``n`` values per channel
        (``n == 0``: the layer was not called)."""
        raise NotImplementedError

    @staticmethod
    def finalize(mean_sum: Tensor, var_sum: Tensor, mean_weight: Tensor,
                 var_weight: Tensor) -> Tuple[Tensor, Tensor]:
        """Running mean and variance from the accumulated sums."""
        raise NotImplementedError


class PopulationEstimator(Estimator):
    """The statistics of every value the layer normalised (the paper's).

    ``mean = sum(n_b mu_b) / N`` and
    ``var = sum((n_b - 1) v_b + n_b mu_b^2) / N - mean^2`` (biased), with
    ``N = sum(n_b)``: each batch weighted by its value count, so the result
    does not depend on how the layer's inputs were split into batches.
    """

    needs_squares = True

    @staticmethod
    def weights(n: int) -> Tuple[float, float]:
        return float(n), float(max(n - 1, 0))

    @staticmethod
    def finalize(mean_sum, var_sum, mean_weight, var_weight):
        mean = mean_sum / mean_weight
        var = (var_sum / mean_weight - mean * mean).clamp_min_(0)
        return mean, var


class BatchAverageEstimator(Estimator):
    """Equal-weight average of batch statistics (mmpretrain, pycls).

    ``mean = sum(mu_b) / B`` and ``var = sum(v_b) / B`` (Bessel-corrected
    batch variances) over the ``B`` calls of the layer.
    """

    @staticmethod
    def weights(n: int) -> Tuple[float, float]:
        return (1.0, 1.0) if n else (0.0, 0.0)

    @staticmethod
    def finalize(mean_sum, var_sum, mean_weight, var_weight):
        return mean_sum / mean_weight, var_sum / var_weight


ESTIMATORS: Dict[str, Type[Estimator]] = {
    'population': PopulationEstimator,
    'batch_average': BatchAverageEstimator,
}
