# Copyright (c) mmstats contributors. All rights reserved.
"""Values reported in DataLoader workers reach the quantile sketches and the
non-finite counts (plain DataLoaders, fork and spawn workers)."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from mmstats.stats import Collector, report
from mmstats.stats.workers import (WorkerReportingCollate,
                                   deliver_worker_reports)
from tests.test_stats.test_sketch import (QS, assert_within_alpha,
                                          lower_quantiles)


def values_of(idx: int) -> np.ndarray:
    """Lognormal over 6 decades, with sign changes, zeros and a NaN."""
    rng = np.random.default_rng(idx)
    values = np.exp(rng.uniform(-7, 7, 40)) * rng.choice([-1., 1.], 40)
    values[:2] = 0.
    return values


class ReportingDataset(Dataset):

    def __len__(self) -> int:
        return 24

    def __getitem__(self, idx: int) -> dict:
        report('data/values', values_of(idx))
        # all non-finite in its batch: a row with n == 0, nonfinite > 0
        report('data/nan', float('nan'))
        return dict(idx=idx)


@pytest.mark.parametrize(
    'context', ['fork', pytest.param('spawn', marks=pytest.mark.slow)])
def test_worker_values_reach_sketches(context):
    collector = Collector('data/.*', sketch=True)
    loader = DataLoader(
        ReportingDataset(),
        batch_size=4,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=WorkerReportingCollate(torch.utils.data.default_collate))
    seen = []
    for batch in loader:
        assert batch.mmstats_reports is not None  # rode with the batch
        deliver_worker_reports(batch)
        seen += batch['idx'].tolist()
    collector.update()
    assert sorted(seen) == list(range(24))
    everything = np.concatenate([values_of(i) for i in seen])
    assert collector.num('data/values') == everything.size
    assert collector.mean('data/values') == pytest.approx(everything.mean())
    assert_within_alpha(
        np.array(collector.quantile('data/values', QS)),
        lower_quantiles(everything, QS))
    assert collector.num('data/nan') == 0
    assert collector.nonfinite('data/nan') == 24
