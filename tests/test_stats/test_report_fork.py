"""A forked DataLoader worker starts with nothing pending: values the
parent reported before the fork are counted once (by the parent), and
the phase and sketch counts of a worker's values are those of the main
process when the batch is delivered."""
import torch
from torch.utils.data import DataLoader, Dataset

from mmstats.stats import Collector, phase, report
from mmstats.stats.workers import (WorkerReportingCollate,
                                   deliver_worker_reports)


class _Reporting(Dataset):

    def __len__(self) -> int:
        return 8

    def __getitem__(self, idx: int) -> dict:
        report('data/idx', float(idx))
        return dict(idx=idx)


def _load(sketch: bool) -> Collector:
    collector = Collector(sketch=sketch)
    report('parent', [1.0, 2.0, 3.0])  # pending when the workers fork
    loader = DataLoader(
        _Reporting(),
        batch_size=2,
        num_workers=2,
        multiprocessing_context='fork',
        collate_fn=WorkerReportingCollate(torch.utils.data.default_collate))
    phase('val')
    try:
        for batch in loader:
            deliver_worker_reports(batch)
    finally:
        phase(None)
    collector.update()
    return collector


def test_forked_workers_do_not_resend_the_parents_values():
    collector = _load(sketch=False)
    assert collector.num('parent') == 3  # not 3 more per worker
    assert collector.num('val/data/idx') == 8
    assert collector.mean('val/data/idx') == 3.5
    # nothing else: no copy of the parent's values under the phase
    assert collector.names() == ['parent', 'val/data/idx']


def test_worker_sketch_counts_follow_the_phase():
    collector = _load(sketch=True)
    assert collector.num('val/data/idx') == 8
    assert abs(collector.quantile('val/data/idx', 0.5) - 3.0) <= 0.04
