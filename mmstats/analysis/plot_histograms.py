# Copyright (c) mmstats contributors. All rights reserved.
"""Draw the all-rank histograms StatsCollectorHook wrote to TensorBoard
(``histogram_regex``) as a heat map over the run.

    python tools/analysis/plot_histograms.py WORK_DIR
        [--tags stats/loss/hist ...] [--out PNG]

Writes ``WORK_DIR/<timestamp>/vis_data/histograms.png`` (the newest run's,
beside its event files) and prints ``wrote PATH``. One panel per histogram
tag, in a grid (``figures.panel_grid``): x the step of each publication,
y the value (a symmetric log axis where the values span more than two
decades or change sign), colour the share of that publication's values
per bin of y (each bucket's count spread evenly over its range, as
TensorBoard draws it), on a log colour scale with a colour bar per panel;
the exact minimum and maximum as lines, named once in the figure's legend
below the panels. A panel whose shares are all one value (every value in
one bin) has no colour bar; its title says the share, on a second
line. Reads the event files under ``WORK_DIR/*/vis_data`` (or a
directory of event files) with tensorboard's ``EventAccumulator``.
"""
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mmstats.analysis.figures import (colorbar, figure_parser, one_value,
                                      panel_grid, save, title, vis_data_dir)
from mmstats.analysis.runs import load_run, mark_resumes, resumed_text, stitch

ROWS = 160  # value bins of the drawing
SHARE = 'share of values per bin'

__all__ = ['main']


def load_histograms(path: str) -> Dict[str, List[Tuple[int, object]]]:
    """``{tag: [(step, HistogramValue), ...]}`` of the newest launch under
    ``path`` (a work dir, or a directory holding event files)."""
    from tensorboard.backend.event_processing.event_accumulator import (
        HISTOGRAMS, EventAccumulator)
    directory = vis_data_dir(path)
    events = EventAccumulator(
        directory, size_guidance={
            HISTOGRAMS: 0
        }).Reload()
    return {
        tag: [(e.step, e.histogram_value) for e in events.Histograms(tag)]
        for tag in events.Tags()['histograms']
    }


def load_run_histograms(work_dir: str
                        ) -> Tuple[Dict[str, List[Tuple[int, object]]], list]:
    """``(histograms, resumed_at)`` of the whole run of ``work_dir``: the
    event files of each launch :func:`runs.load_run` joins, stitched as
    its scalars are; the newest launch's alone where ``work_dir`` holds
    event files itself or has no ``scalars.json``."""
    try:
        run = load_run(work_dir)
    except FileNotFoundError:
        return load_histograms(work_dir), []
    if len(run.files) < 2:
        return load_histograms(work_dir), []
    parts, resumed = [], [None] + list(run.resumed_at)
    for scalars in run.files:
        hists = load_histograms(osp.dirname(scalars))
        parts.append({
            tag: ([s for s, _ in v], [h for _, h in v])
            for tag, v in hists.items()
        })
    joined = stitch(parts, resumed[:len(parts)])
    return {tag: list(zip(*v)) for tag, v in joined.items()}, run.resumed_at


def _forward(y: np.ndarray, scale: float) -> np.ndarray:
    """The symmetric log transform (linear within ``scale`` of zero)."""
    return np.sign(y) * np.log1p(np.abs(y) / scale)


def value_axis(hists: Sequence[object]) -> Tuple[np.ndarray, Optional[float]]:
    """Bin edges in drawing units over every histogram's range, and the
    symlog scale (None: linear)."""
    low = min(h.min for h in hists)
    high = max(h.max for h in hists)
    mags = np.abs([h.min for h in hists] + [h.max for h in hists])
    nonzero = mags[mags > 0]
    scale = None
    if nonzero.size and (low < 0 < high
                         or nonzero.max() > 100 * nonzero.min()):
        scale = max(nonzero.min(), nonzero.max() * 1e-6)
    ends = np.array([low, high], dtype=np.float64)
    if scale is not None:
        ends = _forward(ends, scale)
    if ends[1] <= ends[0]:
        ends = ends + np.array([-0.5, 0.5])
    return np.linspace(ends[0], ends[1], ROWS + 1), scale


def resample(hist: object, edges: np.ndarray,
             scale: Optional[float]) -> np.ndarray:
    """The counts of ``hist`` (a TensorBoard HistogramValue) on ``edges``
    (drawing units), each bucket's count spread evenly over its range in
    drawing units; the result sums to ``hist.num``."""
    limits = np.asarray(hist.bucket_limit, dtype=np.float64)
    counts = np.asarray(hist.bucket, dtype=np.float64)
    lower = np.concatenate([[hist.min], limits[:-1]])
    upper = np.minimum(limits, hist.max)
    lower = np.minimum(lower, upper)
    if scale is not None:
        lower, upper = _forward(lower, scale), _forward(upper, scale)
    out = np.zeros(len(edges) - 1)
    for lo, hi, count in zip(lower, upper, counts):
        if not count:
            continue
        if hi <= lo:  # a point (e.g. exact zeros): its bin
            at = min(
                max(np.searchsorted(edges, lo, 'right') - 1, 0),
                len(out) - 1)
            out[at] += count
            continue
        overlap = np.clip(
            np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None)
        out += count * overlap / (hi - lo)
    return out


def histograms_figure(histograms: Dict[str, List[Tuple[int, object]]],
                      tags: Optional[Sequence[str]] = None,
                      vis_data: str = '',
                      resumed_at: Sequence[int] = ()) -> Any:
    """One panel per tag (a matplotlib Figure), titled with the run of
    ``vis_data``."""
    from matplotlib.colors import LogNorm
    tags = list(tags or sorted(histograms))
    fig, axes = panel_grid(len(tags), 5.0, 3.2)
    for ax, tag in zip(axes, tags):
        steps = np.array([step for step, _ in histograms[tag]])
        hists = [h for _, h in histograms[tag]]
        edges, scale = value_axis(hists)
        share = np.stack(
            [resample(h, edges, scale) / max(h.num, 1) for h in hists], 1)
        x = np.concatenate([
            steps - 0.5 * np.diff(steps, prepend=0), steps[-1:] + 0.5 *
            (steps[-1] - steps[-2])
        ]) if len(steps) > 1 else np.array([steps[0] - 0.5, steps[0] + 0.5])
        masked = np.ma.masked_less_equal(share, 0)
        mesh = ax.pcolormesh(
            x, edges, masked, norm=LogNorm(), cmap='viridis', shading='flat')
        for stat, style in (('min', ':'), ('max', '--')):
            y = np.array([getattr(h, stat) for h in hists])
            ax.plot(
                steps,
                _forward(y, scale) if scale else y,
                'k' + style,
                lw=0.8,
                label=stat)
        if scale is not None:  # label the drawing units in values
            ticks = ax.get_yticks()
            ax.set_yticks(ticks)
            ax.set_yticklabels([
                f'{np.sign(t) * scale * np.expm1(abs(t)):.3g}' for t in ticks
            ])
        # the min / max lines inside the axes, not on their edge
        pad = 0.02 * (edges[-1] - edges[0])
        ax.set_ylim(edges[0] - pad, edges[-1] + pad)
        ax.set_ylabel('value' + (' (symmetric log axis)' if scale else ''))
        only = one_value(masked.compressed())
        ax.set_title(f'{tag} (all ranks)' + (
            '' if only is None else f'\n{SHARE}: {only:.3g} everywhere'))
        ax.set_xlabel('step (epoch for per-epoch summaries)' if tag.
                      split('/')[1] in ('val', 'test') else 'step')
        colorbar(fig, mesh, ax, SHARE, masked.compressed())
        if not tag.split('/')[1] in ('val', 'test'):
            mark_resumes(ax, resumed_at)
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc='outside lower center',
        ncols=2,
        fontsize='small')
    title(fig, 'histograms of StatsCollectorHook' + resumed_text(resumed_at),
          vis_data)
    return fig


def draw(histograms: Dict[str, List[Tuple[int, object]]],
         tags: Optional[Sequence[str]] = None,
         out: str = 'histograms.png',
         vis_data: str = '',
         resumed_at: Sequence[int] = ()) -> str:
    """Draw one panel per tag into ``out``; print ``wrote PATH`` and return
    it."""
    import matplotlib
    matplotlib.use('Agg')
    return save(histograms_figure(histograms, tags, vis_data, resumed_at), out)


def main(argv: Optional[Sequence[str]] = None) -> str:
    """Run the script; returns the path of ``histograms.png``.

    Example:
        .. code-block:: shell

            python -m mmstats.analysis.plot_histograms work_dirs/demo
    """
    parser = figure_parser(__doc__, 'histograms.png',
                           'a work dir or an event directory')
    parser.add_argument('--tags', nargs='+', help='histogram tags to draw')
    args = parser.parse_args(argv)
    directory = vis_data_dir(args.work_dir)
    histograms, resumed_at = load_run_histograms(args.work_dir)
    if not histograms:
        raise SystemExit(f'no histograms in {directory!r}: was '
                         'StatsCollectorHook(histogram_regex=...) run with a '
                         'TensorboardVisBackend?')
    out = args.out or osp.join(directory, 'histograms.png')
    return draw(histograms, args.tags, out, directory, resumed_at)


if __name__ == '__main__':
    main()
