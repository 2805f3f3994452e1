# Copyright (c) mmstats contributors. All rights reserved.
"""Draw the figures of one or several work dirs (installed as
``mmstats-plot``; ``python -m mmstats.tools.plot``).

    mmstats-plot WORK_DIR                 every figure of the run
    mmstats-plot WORK_DIR WORK_DIR ...    the runs against each other
        [--keys loss accuracy] [--out compare.png]

One work dir: ``curves.png`` (loss, accuracy), and where the run published
them ``stats.png`` + ``modules.png`` (StatsCollectorHook, ModuleStatsHook),
``throughput.png`` (ThroughputHook) and ``histograms.png`` (TensorBoard
histograms, needs tensorboard), each of the whole run across its launches
(a resumed run joined, its resumes marked), written beside the newest
launch's ``scalars.json``; prints ``wrote PATH`` for each. Several work
dirs: one figure, a panel per key and a line per run
(``mmstats.analysis.compare``), written to ``--out``. Needs matplotlib
(``pip install 'mmengine-stats[demo]'``).
"""
import argparse
import glob
import os.path as osp
import sys
from typing import List, Optional

from mmstats.tools.entry import console_main

__all__ = ['main', 'cli', 'MISSING_MATPLOTLIB']

MISSING_MATPLOTLIB = ('matplotlib is not installed: the figures need it '
                      "(pip install 'mmengine-stats[demo]' or pip install "
                      'matplotlib)')


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog='mmstats-plot', description=__doc__.splitlines()[0])
    parser.add_argument(
        'work_dirs', nargs='+', metavar='WORK_DIR', help='work dirs of runs')
    parser.add_argument(
        '--keys',
        nargs='+',
        help='several work dirs: the keys compared (default: loss and the '
        'validation metrics they share)')
    parser.add_argument(
        '--out',
        default='compare.png',
        help='several work dirs: the PNG to write. Defaults to '
        'compare.png')
    return parser.parse_args(argv)


def draw_run(work_dir: str) -> List[str]:
    """Every figure of ``work_dir``'s run that its records allow; the
    paths written.

    Example:
        .. code-block:: python

            draw_run('work_dirs/demo')  # ['.../curves.png', ...]
    """
    from mmstats.analysis import plot_stats, plot_throughput
    from mmstats.analysis.plot_curves import plot_training_curves
    from mmstats.analysis.runs import load_run
    run = load_run(work_dir)
    written = [plot_training_curves(work_dir)]
    if any(key.startswith('stats/') for key in run.series):
        written.append(plot_stats.main([work_dir]))
    written.append(plot_throughput.plot_throughput(work_dir))
    written.append(draw_histograms(work_dir))
    return [path for path in written if path]


def draw_histograms(work_dir: str) -> Optional[str]:
    """``histograms.png`` where the run wrote TensorBoard histograms (and
    tensorboard is installed to read them), else None."""
    if not glob.glob(osp.join(work_dir, '*', 'vis_data', 'events.out.*')):
        return None
    try:
        from mmstats.analysis import plot_histograms
        histograms, _ = plot_histograms.load_run_histograms(work_dir)
    except ImportError:
        print(
            'histograms.png not drawn: tensorboard is not installed',
            file=sys.stderr)
        return None
    return plot_histograms.main([work_dir]) if histograms else None


def main(argv: Optional[list] = None) -> List[str]:
    """Draw the figures (see the module's docstring); the paths written.

    Example:
        .. code-block:: shell

            mmstats-plot work_dirs/ema work_dirs/precise_bn --out cmp.png
    """
    args = parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        raise ImportError(MISSING_MATPLOTLIB) from None
    matplotlib.use('Agg')
    if len(args.work_dirs) == 1:
        return draw_run(args.work_dirs[0])
    from mmstats.analysis.compare import compare_figure, run_label
    from mmstats.analysis.figures import save
    from mmstats.analysis.runs import load_run
    runs = {run_label(d): load_run(d) for d in args.work_dirs}
    fig = compare_figure(runs, args.keys)
    if fig is None:
        raise ValueError('the runs share no loss or validation metric: name '
                         'the keys with --keys')
    return [save(fig, args.out)]


def cli(argv: Optional[list] = None) -> int:
    """``mmstats-plot``: :func:`main` with its exit status (0, or 1 and
    one line).

    Example:
        .. code-block:: shell

            mmstats-plot work_dirs/demo
    """
    return console_main(main, 'mmstats-plot', argv)


if __name__ == '__main__':
    sys.exit(cli())
