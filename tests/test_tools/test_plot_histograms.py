"""tools/analysis/plot_histograms.py: the heat map keeps every count, on a
linear and a symmetric log axis, and draws a real run's event file into
the run's ``vis_data/`` (``wrote PATH``, a title, a labelled colour bar; no
colour bar where the shares are one value), a figure that reads at a
glance."""
import os.path as osp
import sys
from types import SimpleNamespace

import numpy as np
import pytest

matplotlib = pytest.importorskip('matplotlib')
pytest.importorskip('tensorboard')
matplotlib.use('Agg')

sys.path.insert(
    0,
    osp.join(
        osp.dirname(osp.dirname(osp.dirname(__file__))), 'tools', 'analysis'))
import plot_histograms  # noqa: E402

import tests.helpers.figures as drawn  # noqa: E402
from tests.helpers.figures import colorbar_labels, suptitle, wrote  # noqa


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


def test_one_share_everywhere_draws_no_colour_bar():
    spread = _hist([1., 1.5, 2., 3.9], [1.2, 2., 4.])
    constant = _hist([0.1] * 4, [0.2])  # one bin holds every value
    histograms = {
        'stats/a/hist': [(1, spread), (2, spread)],
        'stats/lr/hist': [(1, constant), (2, constant)]
    }
    fig = plot_histograms.histograms_figure(histograms, vis_data='x')
    spread_ax, constant_ax = fig.axes[:2]
    assert colorbar_labels(fig) == [plot_histograms.SHARE]
    assert constant_ax.get_title() == (
        f'stats/lr/hist (all ranks)\n{plot_histograms.SHARE}: 1 everywhere')
    assert spread_ax.get_title() == 'stats/a/hist (all ranks)'
    assert suptitle(fig) == 'histograms of StatsCollectorHook: x'
    drawn.assert_readable(fig)
    # the min and max lines inside the axes, not on their edges (clipped)
    for ax in (spread_ax, constant_ax):
        low, high = ax.get_ylim()
        for line in ax.get_lines():
            assert low < min(line.get_ydata()) <= max(
                line.get_ydata()) < high, (ax.get_title(), line.get_label())


def test_draws_the_histograms_of_a_real_run(tmp_path, clean_mmengine, capsys):
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
                health=dict(histogram_regex='model/feat_norm'))
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
    capsys.readouterr()
    # the run's vis_data, beside its event file; one "wrote PATH" line
    vis_data = osp.join(runner.log_dir, 'vis_data')
    out = plot_histograms.main([str(tmp_path)])
    assert out == osp.join(vis_data, 'histograms.png')
    assert wrote(capsys.readouterr().out) == [out]
    assert osp.getsize(out) > 10_000
    fig = plot_histograms.histograms_figure(histograms, vis_data=vis_data)
    assert suptitle(fig) == ('histograms of StatsCollectorHook: '
                             f'{tmp_path.name}/{runner.timestamp}')
    assert colorbar_labels(fig) == [plot_histograms.SHARE] * 2
    assert [ax.get_title() for ax in drawn.panels(fig)] == [
        'stats/model/feat_norm/hist (all ranks)',
        'stats/val/model/feat_norm/hist (all ranks)'
    ]
    # no texts overlapping or cut, a grid, y labels; min/max named once
    drawn.assert_readable(fig)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ['min', 'max']
    other = str(tmp_path / 'h.png')
    assert plot_histograms.main([str(tmp_path), '--out', other]) == other
    assert wrote(capsys.readouterr().out) == [other]
