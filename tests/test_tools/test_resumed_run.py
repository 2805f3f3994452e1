"""One run, one story: a real run interrupted by an exception and resumed
with a longer schedule, launched as a user launches it
(``mmstats.tools.train.cli``, what ``mmstats-train`` runs), then drawn by
``mmstats-plot`` (``mmstats.tools.plot``).

- the failed launch exits with status 1 and one line on stderr, and its
  reason (with the traceback) is in the run's ``.log``;
- the resume warns once that the checkpoint's schedule is kept, naming
  ``train_cfg.max_epochs``; the resumed launch exits with 0 and its summary
  names the curves and the command that draws every figure;
- every figure of the work dir covers the whole run, from the first
  launch's first step to the resumed launch's last, with no duplicate
  step, and says where it was resumed;
- ``mmstats-plot`` with two work dirs draws them against each other.
"""
import contextlib
import io
import os
import os.path as osp
import re
import time
import warnings

import numpy as np
import pytest
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from tests.helpers.figures import suptitle
from tests.helpers.module_stats import MODULES
from tests.helpers.runner import toy_cfg

matplotlib = pytest.importorskip('matplotlib')
matplotlib.use('Agg')

ITERS = 10  # per epoch: 160 samples, batch 16
INTERRUPTED = 25  # in epoch 3 of the first launch; last checkpoint: 20


@HOOKS.register_module(force=True)
class InterruptAt(Hook):
    """Raise at an iteration of a launch that does not resume (a
    preemption, a crash): a test-only hook."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter + 1 == self.iteration and not runner._resume:
            raise RuntimeError(
                f'planted interruption at iteration {self.iteration}')


def _config(path) -> str:
    cfg = toy_cfg(
        str(path / 'work'),
        max_epochs=3,
        log_interval=2,
        report_stats=True,
        custom_imports=dict(
            imports=['tests.helpers.toy', 'tests.test_tools.test_resumed_run'],
            allow_failed_imports=False),
        param_scheduler=dict(
            type='LinearLR', start_factor=1.0, end_factor=0.1, by_epoch=True),
        default_hooks=dict(checkpoint=dict(interval=1)),
        visualizer=dict(
            type='Visualizer',
            vis_backends=[
                dict(type='LocalVisBackend'),
                dict(type='TensorboardVisBackend')
            ]),
        custom_hooks=[
            dict(type='InterruptAt', iteration=INTERRUPTED),
            dict(
                type='mmstats.StatsCollectorHook',
                stats=('mean', 'p50'),
                health=dict(histogram_regex='model/feat_norm')),
            dict(type='mmstats.ModuleStatsHook', modules=MODULES),
            dict(type='mmstats.ThroughputHook'),
        ])
    config = path / 'toy_config.py'
    cfg.dump(str(config))
    return str(config)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    from mmstats.tools.train import cli
    from tests.helpers.runner import clear_mmengine_singletons
    path = tmp_path_factory.mktemp('resumed')
    config = _config(path)
    work = str(path / 'work')
    launches = []
    for argv in ([config], [
            config, '--resume', '--cfg-options', 'train_cfg.max_epochs=4'
    ]):
        if launches:
            time.sleep(1.1)  # the launches' timestamp directories differ
        clear_mmengine_singletons()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(
                err), warnings.catch_warnings():
            # torch's record enables faulthandler on stderr: a StringIO here
            warnings.filterwarnings('ignore', 'Unable to enable fault')
            status = cli(argv)
        launches.append((status, out.getvalue(), err.getvalue()))
    clear_mmengine_singletons()
    logs = sorted(
        osp.join(d, f'{osp.basename(d)}.log')
        for d in (osp.join(work, n) for n in os.listdir(work))
        if osp.isdir(d) and osp.isfile(osp.join(d, f'{osp.basename(d)}.log')))
    return dict(
        work=work,
        launches=launches,
        logs=[open(log).read() for log in logs],
        path=path)


def test_a_failed_launch_says_why_in_one_line_and_in_its_log(run):
    (status, _, err), _ = run['launches']
    assert status == 1
    lines = [line for line in err.splitlines() if 'error' in line.lower()]
    assert len(lines) == 1, err[-3000:]
    assert re.fullmatch(
        r'mmstats-train: error: RuntimeError: planted interruption at '
        r'iteration 25 \(traceback in .*\.log\)', lines[0]), lines
    first_log = run['logs'][0]
    assert ('the run failed: RuntimeError: planted interruption at iteration'
            ' 25') in first_log
    assert 'Traceback (most recent call last)' in first_log
    assert 'in before_train_iter' in first_log


def test_the_resume_warns_once_that_the_schedule_is_kept(run):
    _, (status, out, err) = run['launches']
    assert status == 0, err[-3000:]
    log = run['logs'][1]
    assert 'resumed epoch: 2, iter: 20' in log
    assert log.count("resume keeps the checkpoint's schedule") == 1
    assert (
        "param_scheduler[0] (LinearLR) ends at epoch 3 as saved, at 4 "
        "in this config (train_cfg.max_epochs=4, the checkpoint's 3)") in log
    assert 'resume keeps' not in run['logs'][0]
    plots = re.search(r'^plots: +(.*)$', out, re.M).group(1)
    assert re.fullmatch(
        r'\S+/curves\.png \(every figure: mmstats-plot \S+/work\)',
        plots), plots


def _ranges(fig) -> list:
    """``(title, unit, first, last)`` of the data on every axis of ``fig``
    counting iterations or epochs (lines, heat-map columns; a histogram's
    min and max lines), the resume markers left out."""
    ranges = []
    for ax in fig.axes:
        unit = ax.get_xlabel().split(' ')[0]
        if unit not in ('iteration', 'epoch', 'step'):
            continue
        xs = [
            np.asarray(line.get_xdata(), float) for line in ax.get_lines()
            if line.get_label() != 'resumed'
        ]
        if ax.images:  # a heat map: its columns' labels
            xs.append(
                np.asarray([
                    float(t.get_text()) for t in ax.get_xticklabels()
                    if t.get_text()
                ]))
        if xs:
            values = np.concatenate(xs)
            ranges.append((ax.get_title(), unit, values.min(), values.max()))
    return ranges


def test_every_figure_covers_the_whole_run(run, capsys):
    from mmstats.analysis import plot_histograms, plot_stats, plot_throughput
    from mmstats.analysis.plot_curves import curves_figure
    from mmstats.analysis.runs import load_run
    from mmstats.tools.plot import main
    whole = load_run(run['work'])
    assert whole.resumed_at == [20]
    steps = whole.series['loss'][0]
    assert steps == list(range(2, 41, 2))  # no gap, no duplicate
    assert whole.series['accuracy'][0] == [1, 2, 3, 4]  # epochs
    written = main([run['work']])
    assert sorted(osp.basename(p) for p in written) == [
        'curves.png', 'histograms.png', 'stats.png', 'throughput.png'
    ]
    assert osp.isfile(osp.join(osp.dirname(written[0]), 'modules.png'))
    histograms, resumed = plot_histograms.load_run_histograms(run['work'])
    figures = [
        curves_figure(whole.series, whole.files[-1], whole.resumed_at),
        plot_stats.names_figure(whole.series, ['loss', 'model/feat_norm'],
                                'stats', (True, False), False, whole.files[-1],
                                whole.resumed_at),
        plot_stats.modules_figure(whole.series, 'stats', 'modules',
                                  'iteration', whole.files[-1],
                                  whole.resumed_at),
        plot_throughput.throughput_figure(whole.series, whole.files[-1],
                                          whole.resumed_at),
        plot_histograms.histograms_figure(histograms,
                                          ['stats/model/feat_norm/hist'], '',
                                          resumed),
    ]
    for ax in figures[0].axes:  # curves.png: whole epochs, iterations
        ticks = ax.get_xticks()
        assert all(float(t).is_integer() for t in ticks), ticks
    for fig in figures:
        assert 'resumed at iteration 20' in suptitle(fig)
        ranges = _ranges(fig)
        assert ranges, suptitle(fig)
        for title, unit, first, last in ranges:
            whole = (1, 4) if unit == 'epoch' else (2, 40)  # 4 x 10 iters
            assert (first, last) == whole, (suptitle(fig), title, unit)
    capsys.readouterr()


def test_two_work_dirs_are_drawn_against_each_other(run, capsys):
    from mmstats.tools.plot import main
    other = run['path'] / 'other'
    os.symlink(run['work'], other)
    out = str(run['path'] / 'compare.png')
    assert main([run['work'], str(other), '--out', out]) == [out]
    assert osp.getsize(out) > 10_000


def test_a_resumed_launch_replaces_the_validations_it_repeats():
    """Checkpoints every 2 epochs, validation every epoch: the interrupted
    launch validated epochs 1-3 and was killed in epoch 4; the resume from
    epoch 2 (iteration 20) validates epoch 3 again. Epochs are not
    iterations, so the resume iteration cuts nothing here: the resumed
    launch's first epoch does. Losses without a known resume iteration
    (no ``resumed`` line in an old ``.log``) are cut the same way."""
    from mmstats.analysis.runs import stitch
    interrupted = {
        'accuracy': ([1, 2, 3], [50., 60., 65.]),
        'loss': ([10, 20, 30, 35], [4., 3., 2., 1.9]),
    }
    resumed = {
        'accuracy': ([3, 4], [66., 70.]),
        'loss': ([30, 40], [2.1, 1.5]),
    }
    whole = stitch([interrupted, resumed], [None, 20])
    assert whole['accuracy'] == ([1, 2, 3, 4], [50., 60., 66., 70.])
    assert whole['loss'] == ([10, 20, 30, 40], [4., 3., 2.1, 1.5])
    unknown = stitch([interrupted, resumed], [None, None])
    assert unknown['loss'] == ([10, 20, 30, 40], [4., 3., 2.1, 1.5])
