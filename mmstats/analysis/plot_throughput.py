# Copyright (c) mmstats contributors. All rights reserved.
"""Plot what ThroughputHook published, from a run's scalars.json.

    python tools/analysis/plot_throughput.py WORK_DIR [--out PNG]

Writes ``WORK_DIR/<timestamp>/vis_data/throughput.png`` (beside the
newest run's ``scalars.json``) and prints ``wrote PATH``: samples per
second (and MFU where it was published, on its own axis) and the peak
memory of every interval (CUDA allocated and reserved, or the CPU peak
RSS), each point coloured by the rank that held the peak, with a colour
bar where that rank changes; where one rank always held it (a one-rank
run) the legend names it instead. The x axis is the iteration each
publication ends at; each point covers the iterations since the previous
one.
"""
import os.path as osp
import sys
from typing import Any, Optional, Sequence

from mmstats.analysis.figures import colorbar, figure_parser, save, title
from mmstats.analysis.plot_curves import work_dir_of
from mmstats.analysis.plot_stats import find_scalars  # noqa: F401
from mmstats.analysis.runs import load_scalars  # noqa: F401
from mmstats.analysis.runs import Series, load_run, mark_resumes, resumed_text

MEMORY = (('memory/max_allocated', 'CUDA allocated'),
          ('memory/max_reserved', 'CUDA reserved'), ('memory/max_rss',
                                                     'peak RSS (since start)'))

__all__ = ['main']


def plot_throughput(scalars_path: str,
                    out_path: Optional[str] = None) -> Optional[str]:
    """Draw the PNG of the whole run of ``scalars_path`` (a work dir or a
    launch's ``scalars.json``; default: ``throughput.png`` beside the
    newest launch's), print ``wrote PATH``; returns its path, or None
    without ThroughputHook's keys."""
    import matplotlib
    matplotlib.use('Agg')
    run = load_run(work_dir_of(scalars_path))
    scalars_path = run.files[-1]
    fig = throughput_figure(run.series, scalars_path, run.resumed_at)
    if fig is None:
        return None
    return save(
        fig, out_path or osp.join(osp.dirname(scalars_path), 'throughput.png'))


def throughput_figure(series: Series,
                      scalars_path: str = '',
                      resumed_at: Sequence[int] = ()) -> Any:
    """The figure (None without ThroughputHook's keys in ``series``),
    titled with the run of ``scalars_path``."""
    if 'throughput/samples_per_s' not in series and not any(
            key in series for key, _ in MEMORY):
        return None
    import matplotlib
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 5.5), sharex=True, constrained_layout=True)
    _draw_rates(top, series)
    top.set_title('throughput of each interval')
    memory = [(i, key, label) for i, (key, label) in enumerate(MEMORY)
              if key in series]
    ranks_seen = sorted({
        int(r)
        for key, _ in MEMORY
        for r in series.get(f'{key}_rank', ([], []))[1]
    })
    for i, key, label in memory:
        steps, values = series[key]
        ranks = series.get(f'{key}_rank', ([], []))[1]
        if len(ranks_seen) == 1 and len(ranks) == len(values):
            label += f' (peak on rank {ranks_seen[0]})'
        bottom.plot(steps, values, '-', color=f'C{i + 1}', label=label)
        if len(ranks_seen) > 1 and len(ranks) == len(values):
            bottom.scatter(
                steps,
                values,
                c=ranks,
                cmap='viridis',
                vmin=ranks_seen[0],
                vmax=ranks_seen[-1],
                zorder=3,
                s=18)
    mappable = matplotlib.cm.ScalarMappable(
        norm=matplotlib.colors.Normalize(ranks_seen[0], ranks_seen[-1])
        if ranks_seen else None,
        cmap='viridis')
    bar = colorbar(fig, mappable, bottom, 'rank holding the peak', ranks_seen)
    if bar is not None:
        bar.set_ticks(ranks_seen)
    bottom.set_title('peak memory of each interval')
    bottom.set_ylabel('peak memory (MiB, max over ranks)')
    bottom.set_xlabel('iteration (the end of each interval)')
    for ax in (top, bottom):
        mark_resumes(ax, resumed_at)
    if memory or resumed_at:
        bottom.legend(loc='lower right')
    title(fig, 'throughput and peak memory' + resumed_text(resumed_at),
          osp.dirname(scalars_path))
    return fig


def _draw_rates(top, series: Series) -> None:
    """The samples/s line of :func:`throughput_figure` and MFU on a
    second axis."""
    top.set_ylabel('samples / s (all ranks)')
    if 'throughput/samples_per_s' in series:
        steps, values = series['throughput/samples_per_s']
        top.plot(steps, values, 'o-', color='C0', label='samples/s')
        top.set_ylim(bottom=0)
    if 'throughput/mfu' in series:
        right = top.twinx()
        steps, values = series['throughput/mfu']
        right.plot(
            steps, [100 * v for v in values], 's--', color='C3', label='MFU')
        right.set_ylabel('MFU (%)', color='C3')
        right.set_ylim(bottom=0)


def main(argv: Optional[list] = None) -> str:
    """Run the script; returns the path of ``throughput.png``.

    Example:
        .. code-block:: shell

            python -m mmstats.analysis.plot_throughput work_dirs/demo
    """
    args = figure_parser(__doc__, 'throughput.png').parse_args(argv)
    path = plot_throughput(args.work_dir, args.out)
    if path is None:
        sys.exit(f'no ThroughputHook keys in {args.work_dir}')
    return path


if __name__ == '__main__':
    main()
