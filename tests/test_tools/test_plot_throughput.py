"""tools/analysis/plot_throughput.py on written scalars.json files: the
PNG in the run's ``vis_data/`` (``wrote PATH``), a title, and the colour
bar of the rank holding the peak only where that rank changes; on a real
run's, a figure that reads at a glance."""
import json
import os
import os.path as osp
import sys

import pytest

matplotlib = pytest.importorskip('matplotlib')
matplotlib.use('Agg')

sys.path.insert(
    0,
    osp.join(
        osp.dirname(osp.dirname(osp.dirname(__file__))), 'tools', 'analysis'))
import plot_throughput  # noqa: E402
from plot_curves import load_scalars  # noqa: E402

import tests.helpers.figures as drawn  # noqa: E402
from tests.helpers.figures import colorbar_labels, suptitle, wrote  # noqa


def _write(path, records):
    with open(path, 'w') as f:
        for record in records:
            f.write(json.dumps(record) + '\n')


def _records(rank_of_step):
    return [{
        'step': step,
        'throughput/samples_per_s': 100.0 + step,
        'throughput/mfu': 0.4,
        'memory/max_allocated': 1000.0 + step,
        'memory/max_allocated_rank': rank_of_step(step),
        'memory/max_reserved': 2000.0,
        'memory/max_reserved_rank': 0,
    } for step in (10, 20, 30)] + [{
        'step': 30,
        'loss': 1.0
    }]


def _run_dir(tmp_path):
    vis_data = tmp_path / 'work' / '20260101_120000' / 'vis_data'
    os.makedirs(vis_data)
    return vis_data


def test_png_with_mfu_and_the_ranks_of_the_peaks(tmp_path, capsys):
    vis_data = _run_dir(tmp_path)
    path = str(vis_data / 'scalars.json')
    _write(path, _records(lambda step: step // 10 % 2))  # ranks 1, 0, 1
    out = plot_throughput.main([str(tmp_path / 'work')])
    assert out == str(vis_data / 'throughput.png') and osp.getsize(out) > 0
    assert wrote(capsys.readouterr().out) == [out]
    fig = plot_throughput.throughput_figure(load_scalars(path), path)
    assert suptitle(fig) == ('throughput and peak memory: '
                             'work/20260101_120000')
    assert colorbar_labels(fig) == ['rank holding the peak']
    bar = [ax for ax in fig.axes if hasattr(ax, '_colorbar')][0]
    assert list(bar.get_yticks()) == [0, 1]
    assert len(fig.axes[1].collections) == 2  # both memories' points
    assert [ax.get_title() for ax in fig.axes[:2]] == [
        'throughput of each interval', 'peak memory of each interval'
    ]
    drawn.assert_readable(fig)  # with MFU's axis and the colour bar


def test_one_rank_draws_no_rank_colour_bar(tmp_path):
    path = str(tmp_path / 'scalars.json')
    _write(path, _records(lambda step: 0))
    fig = plot_throughput.throughput_figure(load_scalars(path), path)
    assert colorbar_labels(fig) == []
    memory = fig.axes[1]
    assert [t.get_text() for t in memory.get_legend().get_texts()] == [
        'CUDA allocated (peak on rank 0)', 'CUDA reserved (peak on rank 0)'
    ]
    assert len(memory.collections) == 0  # no points coloured by one rank
    assert plot_throughput.plot_throughput(path) == str(tmp_path /
                                                        'throughput.png')


def test_nothing_without_the_hook_keys(tmp_path):
    path = str(tmp_path / 'scalars.json')
    _write(path, [{'step': 1, 'loss': 1.0}])
    assert plot_throughput.plot_throughput(path) is None
    with pytest.raises(SystemExit, match='no ThroughputHook keys'):
        plot_throughput.main([path])


def test_real_run_figure_reads_at_a_glance(tmp_path, clean_mmengine):
    from mmengine.runner import Runner

    from tests.helpers.runner import toy_cfg
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        max_iters=6,
        log_interval=2,
        custom_hooks=[
            dict(type='mmstats.StatsCollectorHook'),
            dict(type='mmstats.ThroughputHook')
        ])
    Runner.from_cfg(cfg).train()
    path = plot_throughput.find_scalars(str(tmp_path))
    series = load_scalars(path)
    assert len(series['throughput/samples_per_s'][0]) == 3
    fig = plot_throughput.throughput_figure(series, path)
    drawn.assert_readable(fig)
    assert fig.axes[1].get_legend().get_texts()  # the memory it published
