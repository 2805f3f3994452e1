"""Estimator formulas against numpy (float64)."""
import numpy as np
import torch

from mmstats.precise_bn import BatchAverageEstimator, PopulationEstimator


def test_estimator_formulas_against_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=n) for n in (5, 9, 2, 9)]
    mean_sum = var_sum = mean_w = var_w = 0.0
    for est in (PopulationEstimator, BatchAverageEstimator):
        sums = np.zeros(4)
        for x in batches:
            w_mean, w_var = est.weights(len(x))
            mu, v = x.mean(), x.var(ddof=1)
            sums += [
                w_mean * mu,
                w_var * v + (w_mean * mu * mu if est.needs_squares else 0),
                w_mean, w_var
            ]
        mean_sum, var_sum, mean_w, var_w = map(torch.tensor, sums)
        mean, var = est.finalize(mean_sum, var_sum, mean_w, var_w)
        if est is PopulationEstimator:  # every value, biased variance
            union = np.concatenate(batches)
            ref = (union.mean(), union.var())
        else:  # equal-weight average of batch statistics
            ref = (np.mean([x.mean() for x in batches]),
                   np.mean([x.var(ddof=1) for x in batches]))
        np.testing.assert_allclose([float(mean), float(var)], ref, rtol=1e-12)
    assert PopulationEstimator.weights(0) == (0.0, 0.0)
    assert BatchAverageEstimator.weights(0) == (0.0, 0.0)
