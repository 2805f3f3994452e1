"""tools/analysis/plot_histograms.py: the heat map keeps every count, on a
linear and a symmetric log axis, and draws a real run's event file."""
import os.path as osp
import sys
from types import SimpleNamespace

import numpy as np
import pytest

matplotlib = pytest.importorskip('matplotlib')
pytest.importorskip('tensorboard')
matplotlib.use('Agg')

sys.path.insert(
    0, osp.join(osp.dirname(osp.dirname(__file__)), 'tools', 'analysis'))
import plot_histograms  # noqa: E402


def _hist(values, limits):
    values = np.asarray(values, dtype=np.float64)
    counts = np.bincount(
        np.searchsorted(limits, values, side='left'), minlength=len(limits))
    return SimpleNamespace(
        min=values.min(),
        max=values.max(),
        num=values.size,
        bucket_limit=list(limits),
        bucket=list(counts))


@pytest.mark.parametrize('values, limits', [
    ([1., 1.5, 2., 3.9], [1.2, 2., 4.]),
    ([-300., -1e-3, 0., 0., 5e-4, 2.], [-1e-3, -1e-300, 0., 1e-3, 2.]),
])
def test_resampling_keeps_every_count(values, limits):
    hist = _hist(values, limits)
    edges, scale = plot_histograms.value_axis([hist])
    assert (scale is None) == (min(values) > 0)  # linear / symlog
    share = plot_histograms.resample(hist, edges, scale)
    assert share.sum() == pytest.approx(len(values))
    assert (share >= 0).all()


def test_draws_the_histograms_of_a_real_run(tmp_path, clean_mmengine):
    from mmengine.runner import Runner

    from tests.helpers.runner import toy_cfg
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        max_iters=6,
        log_interval=2,
        report_stats=True,
        visualizer=dict(
            type='Visualizer',
            vis_backends=[dict(type='TensorboardVisBackend')]),
        custom_hooks=[
            dict(
                type='mmstats.StatsCollectorHook',
                stats=('mean', 'p50'),
                histogram_regex='model/feat_norm')
        ])
    runner = Runner.from_cfg(cfg)
    runner.train()
    runner.visualizer.close()
    histograms = plot_histograms.load_histograms(str(tmp_path))
    assert [s
            for s, _ in histograms['stats/model/feat_norm/hist']] == [2, 4, 6]
    # validation's own (64 samples, one norm each), at LoggerHook's step for
    # its metrics (log_metric_by_epoch: the epoch, 0 in an iteration loop)
    (step, val), = histograms['stats/val/model/feat_norm/hist']
    assert (step, val.num, sum(val.bucket)) == (0, 64, 64)
    out = plot_histograms.main(
        [str(tmp_path), '--out',
         str(tmp_path / 'h.png')])
    assert osp.getsize(out) > 0
