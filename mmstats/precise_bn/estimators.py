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
    """Base class: per-call weights and the final formula.

    Example:
        >>> ESTIMATORS['population'] is PopulationEstimator
        True
        >>> issubclass(PopulationEstimator, Estimator)
        True
    """

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

    Example:
        >>> import torch
        >>> # batches [0, 2] and [4]: means 1 and 4, unbiased vars 2 and 0
        >>> (w1, v1), (w2, v2) = (PopulationEstimator.weights(n)
        ...                       for n in (2, 1))
        >>> mean, var = PopulationEstimator.finalize(
        ...     torch.tensor([w1 * 1. + w2 * 4.]),
        ...     torch.tensor([v1 * 2. + w1 * 1. + v2 * 0. + w2 * 16.]),
        ...     torch.tensor([w1 + w2]), torch.tensor([v1 + v2]))
        >>> mean.item(), round(var.item(), 6)  # of [0, 2, 4]
        (2.0, 2.666667)
    """

    needs_squares = True

    @staticmethod
    def weights(n: int) -> Tuple[float, float]:
        return float(n), float(max(n - 1, 0))

    @staticmethod
    def finalize(mean_sum: Tensor, var_sum: Tensor, mean_weight: Tensor,
                 var_weight: Tensor) -> Tuple[Tensor, Tensor]:
        mean = mean_sum / mean_weight
        var = (var_sum / mean_weight - mean * mean).clamp_min_(0)
        return mean, var


class BatchAverageEstimator(Estimator):
    """Equal-weight average of batch statistics (mmpretrain, pycls).

    ``mean = sum(mu_b) / B`` and ``var = sum(v_b) / B`` (Bessel-corrected
    batch variances) over the ``B`` calls of the layer.

    Example:
        >>> import torch
        >>> mean, var = BatchAverageEstimator.finalize(
        ...     torch.tensor([1. + 4.]), torch.tensor([2. + 0.]),
        ...     torch.tensor([2.]), torch.tensor([2.]))
        >>> mean.item(), var.item()
        (2.5, 1.0)
    """

    @staticmethod
    def weights(n: int) -> Tuple[float, float]:
        return (1.0, 1.0) if n else (0.0, 0.0)

    @staticmethod
    def finalize(mean_sum: Tensor, var_sum: Tensor, mean_weight: Tensor,
                 var_weight: Tensor) -> Tuple[Tensor, Tensor]:
        return mean_sum / mean_weight, var_sum / var_weight


ESTIMATORS: Dict[str, Type[Estimator]] = {
    'population': PopulationEstimator,
    'batch_average': BatchAverageEstimator,
}
