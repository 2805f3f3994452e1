"""tools/analysis/plot_stats.py on a small real run (heat map, panels, x
axis units, the PNGs in the run's ``vis_data/`` with ``wrote PATH``,
titles, labelled colour bars; every figure readable at a glance, every
per-module statistic drawn, the optimizer's with SGD and with Adam) and on
written scalars.json files (quantile bands, bounded quantities, log loss
axis, legends outside the curves, no one-value colour bar)."""
import json
import os.path as osp
import re
import sys

import numpy as np
import pytest

matplotlib = pytest.importorskip('matplotlib')
matplotlib.use('Agg')

sys.path.insert(
    0,
    osp.join(
        osp.dirname(osp.dirname(osp.dirname(__file__))), 'tools', 'analysis'))
import plot_curves  # noqa: E402
import plot_stats  # noqa: E402
from plot_curves import load_scalars  # noqa: E402

import tests.helpers.figures as drawn  # noqa: E402
from tests.helpers.figures import colorbar_labels, suptitle, wrote  # noqa


@pytest.fixture(autouse=True)
def close_figures():
    """Close the figures a test drew (pyplot keeps them open)."""
    yield
    import matplotlib.pyplot as plt
    plt.close('all')


@pytest.fixture(scope='module')
def real_run(tmp_path_factory):
    """2 epochs of 5 iterations of the toy model with both hooks (SGD with
    momentum, its state reported)."""
    return _train(tmp_path_factory.mktemp('run'))


def _train(work_dir, **overrides) -> str:
    from mmengine.runner import Runner

    from tests.helpers.runner import clear_mmengine_singletons, toy_cfg
    cfg = toy_cfg(
        work_dir,
        num_samples=80,
        log_interval=2,
        report_stats=True,
        custom_hooks=[
            dict(type='mmstats.StatsCollectorHook'),
            dict(
                type='mmstats.ModuleStatsHook',
                modules=r'backbone\.stem|head',
                optimizer_state=True)
        ],
        **overrides)
    Runner.from_cfg(cfg).train()
    clear_mmengine_singletons()
    return str(work_dir)


def _write(path, records):
    with open(path, 'w') as f:
        for record in records:
            f.write(json.dumps(record) + '\n')
    return str(path)


def test_real_run_pictures(real_run, tmp_path, capsys):
    out = str(tmp_path / 'stats.png')
    assert plot_stats.main([real_run, '--out', out]) == out
    assert wrote(
        capsys.readouterr().out) == [out, str(tmp_path / 'modules.png')]
    for path in (out, str(tmp_path / 'modules.png')):
        assert osp.getsize(path) > 10_000
    path = plot_stats.find_scalars(real_run)
    vis_data = osp.dirname(path)
    # by default: in the run's vis_data, beside scalars.json
    assert plot_stats.main([real_run]) == osp.join(vis_data, 'stats.png')
    assert wrote(capsys.readouterr().out) == [
        osp.join(vis_data, 'stats.png'),
        osp.join(vis_data, 'modules.png')
    ]
    run = f'{osp.basename(real_run)}/{osp.basename(osp.dirname(vis_data))}'
    series = load_scalars(path)
    fig = plot_stats.modules_figure(
        series, 'stats', 'modules', scalars_path=path)
    assert suptitle(fig) == f'ModuleStatsHook: {run}'
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[:4] == [
        'activation scale (rms) (log colour scale)',
        'gradient norm (log colour scale)', 'weight norm (log colour scale)',
        'update ratio ||dw|| / ||w|| (log colour scale)'
    ]
    assert colorbar_labels(fig)[:4] == [
        'act', 'grad_norm', 'weight_norm', 'update_ratio'
    ]
    names = plot_stats.names_figure(
        series, ['loss'], 'stats', (True, False), scalars_path=path)
    assert suptitle(names) == f'StatsCollectorHook: {run}'
    # the loss and accuracy curves (tools/train.py draws them too)
    assert plot_curves.main([real_run]) == osp.join(vis_data, 'curves.png')
    assert wrote(capsys.readouterr().out) == [osp.join(vis_data, 'curves.png')]
    curves = plot_curves.curves_figure(series, path)
    assert suptitle(curves) == f'training curves: {run}'
    assert [ax.get_title()
            for ax in curves.axes] == ['train loss', 'val accuracy (%)']
    heat = fig.axes[0]
    assert [t.get_text()
            for t in heat.get_yticklabels()] == ['backbone.stem', 'head']
    image = heat.get_images()[0]
    assert type(image.norm).__name__ == 'LogNorm'
    names, steps, matrix = plot_stats.module_matrix(series, 'stats', 'modules',
                                                    'act')
    mean = np.asarray(series['stats/modules/head/act/mean'][1])
    std = np.asarray(series['stats/modules/head/act/std'][1])
    np.testing.assert_allclose(matrix[names.index('head')],
                               np.sqrt(mean**2 + std**2))
    assert list(steps) == series['stats/modules/head/act/mean'][0]
    # x axes: iterations for training statistics, epochs for validation
    units = plot_stats.epoch_units(path)
    assert units == (True, False)
    fig = plot_stats.names_figure(series, ['loss', 'val/model/feat_norm'],
                                  'stats', units)
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert panels['loss'].get_xlabel() == 'iteration'
    assert panels['val/model/feat_norm'].get_xlabel() == 'epoch'


def _legend_outside(fig, ax):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    return legend.x0 >= ax.get_window_extent(renderer).x1


def test_bounded_band_stays_in_range(tmp_path):
    steps = [10, 20, 30]
    records = [{
        'stats/p_true/mean': 0.95,
        'stats/p_true/std': 0.2,
        'stats/p_true/min': 0.4,
        'stats/p_true/max': 1.0,
        'stats/acc/mean': 0.5,
        'stats/acc/std': 0.45,
        'step': s
    } for s in steps]
    series = load_scalars(_write(tmp_path / 'scalars.json', records))
    fig = plot_stats.names_figure(series, ['p_true', 'acc'], 'stats',
                                  (False, False))
    for ax in fig.axes:
        band = ax.collections[0].get_paths()[0].vertices[:, 1]
        assert band.min() >= 0 and band.max() <= 1, ax.get_title()
        assert _legend_outside(fig, ax)
    p_true = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert p_true.max() == pytest.approx(1.0)  # 0.95 + 0.2 clipped
    assert p_true.min() == pytest.approx(0.75)


def test_quantile_bands_and_log_loss(tmp_path):
    losses = np.geomspace(10, 0.01, 6)
    records = [{
        'stats/loss/mean': v,
        'stats/loss/p1': v / 3,
        'stats/loss/p50': v / 2,
        'stats/loss/p99': 3 * v,
        'stats/lr/mean': 0.1,
        'stats/lr/std': 0.0,
        'step': 10 * (i + 1)
    } for i, v in enumerate(losses)]
    series = load_scalars(_write(tmp_path / 'scalars.json', records))
    fig = plot_stats.names_figure(series, ['loss', 'lr'], 'stats',
                                  (False, False))
    loss, lr = fig.axes
    labels = [t.get_text() for t in loss.get_legend().get_texts()]
    assert sorted(labels) == ['p1-p99', 'p50']  # no mean band
    band = loss.collections[0].get_paths()[0].vertices[:, 1]
    assert band.max() == pytest.approx(30) and band.min() == pytest.approx(
        0.01 / 3)
    assert loss.get_yscale() == 'log'  # four decades: automatic
    assert lr.get_yscale() == 'linear'
    flat = [{'stats/loss/mean': 2.0 + 0.1 * i, 'step': i} for i in range(5)]
    series = load_scalars(_write(tmp_path / 'flat.json', flat))
    fig = plot_stats.names_figure(series, ['loss'], 'stats', (False, False))
    assert fig.axes[0].get_yscale() == 'linear'
    fig = plot_stats.names_figure(
        series, ['loss'], 'stats', (False, False), log_loss=True)
    assert fig.axes[0].get_yscale() == 'log'


def test_one_value_heat_map_draws_no_colour_bar(tmp_path):
    records = [{
        'stats/modules/head/grad_norm/mean': 0.5,
        'stats/modules/stem/grad_norm/mean': 0.5,
        'stats/modules/head/update_ratio/mean': 1e-3 * s,
        'stats/modules/stem/update_ratio/mean': 2e-3 * s,
        'step': s
    } for s in (1, 2, 3)]
    series = load_scalars(_write(tmp_path / 'scalars.json', records))
    fig = plot_stats.modules_figure(series, 'stats', 'modules')
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [
        'gradient norm: 0.5 everywhere',
        'update ratio ||dw|| / ||w|| (log colour scale)'
    ]
    assert colorbar_labels(fig) == ['update_ratio']


def test_unknown_key_names_the_available_ones(real_run):
    with pytest.raises(SystemExit, match="available: .*'loss'"):
        plot_stats.main([real_run, '--keys', 'no/such'])


def _module_stats_in(path):
    """The ``<stat>`` of every ``stats/modules/<module>/<stat>/mean`` key
    of a scalars.json, read without the tool's code."""
    found = set()
    with open(path) as f:
        for line in f:
            for key in json.loads(line):
                match = re.fullmatch(r'stats/modules/[^/]+/([^/]+)/mean', key)
                if match:
                    found.add(match.group(1))
    return found


def _readable_pictures(work_dir, optimizer_stats):
    """Every figure of plot_stats (and plot_curves) of ``work_dir`` reads
    at a glance; modules.png has a panel per per-module statistic, the
    optimizer's ``optimizer_stats`` and weight_norm among them."""
    path = plot_stats.find_scalars(work_dir)
    series = load_scalars(path)
    collected = _module_stats_in(path)
    assert {'act', 'grad_norm', 'weight_norm', 'update_ratio'
            } | optimizer_stats <= collected
    modules = plot_stats.modules_figure(
        series, 'stats', 'modules', scalars_path=path)
    drawn.assert_readable(modules)
    # a panel per statistic, each with its colour bar (none is one value)
    assert sorted(colorbar_labels(modules)) == sorted(collected)
    assert len(drawn.panels(modules)) == len(collected)
    names = sorted(
        n for n in plot_stats.reported_names(series, 'stats')
        if not n.startswith('modules/') or n.count('/') == 1)
    assert 'modules/total_grad_norm' in names and len(names) >= 7
    stats = plot_stats.names_figure(
        series,
        names,
        'stats',
        plot_stats.epoch_units(path),
        scalars_path=path)
    drawn.assert_readable(stats)
    assert sorted(ax.get_title() for ax in drawn.panels(stats)) == names
    assert stats.get_size_inches()[0] > stats.get_size_inches()[1]  # a grid
    drawn.assert_readable(plot_curves.curves_figure(series, path))


def test_real_run_figures_read_at_a_glance(real_run):
    _readable_pictures(real_run,
                       {'momentum_buffer_norm', 'momentum_buffer_cos'})


def test_adam_run_figures_read_at_a_glance(tmp_path, clean_mmengine):
    run = _train(
        tmp_path,
        max_epochs=1,
        optim_wrapper=dict(
            optimizer=dict(_delete_=True, type='Adam', lr=1e-3)))
    _readable_pictures(run,
                       {'exp_avg_norm', 'exp_avg_cos', 'exp_avg_sq_sqrt_norm'})
