# Copyright (c) mmstats contributors. All rights reserved.
"""Plot the statistics of a run from its scalars.json.

    python tools/analysis/plot_stats.py WORK_DIR [--keys loss model/feat_norm]
        [--modules-prefix modules] [--log-loss] [--out PNG]

Writes ``WORK_DIR/<timestamp>/vis_data/stats.png`` (beside the newest
run's ``scalars.json``; one panel per reported name, ModuleStatsHook's
per-run names such as ``modules/total_grad_norm`` included: the p50 line
in a p1-p99 band where StatsCollectorHook published quantiles, the mean in
a mean+-std band otherwise, with min/max) and, when ModuleStatsHook ran,
``modules.png`` beside it (one heat map modules x iterations per
per-module statistic the run published: activation scale, gradient norm,
weight norm, update ratio and, with ``optimizer_state=True``, the
optimizer's moments and cosines; on a log colour scale where every value
is positive, a linear one otherwise, each with a colour bar labelled with
the statistic's key; a map of one value everywhere says it in its title
instead), and prints ``wrote PATH`` for each. The panels sit in a grid
(see ``figures.panel_grid``), each with a y-axis label. Each panel's x
axis says what it counts (iteration, or epoch for per-epoch summaries and
validation), legends sit outside the axes, losses spanning more than a
decade are drawn on a log axis (or always with ``--log-loss``) and bands
never leave the range of the values (nor [0, 1] for bounded quantities).
"""
import os.path as osp
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mmstats.analysis.figures import (colorbar, figure_parser, one_value,
                                      panel_grid, save, title)
from mmstats.analysis.plot_curves import work_dir_of
from mmstats.analysis.runs import load_scalars  # noqa: F401
from mmstats.analysis.runs import (Series, launches, load_run, mark_resumes,
                                   resumed_text)

QUANTILE = re.compile(r'p(\d{1,2}(?:\.\d+)?)$')
BASE_STATS = ('num', 'mean', 'std', 'min', 'max', 'nonfinite')
# ModuleStatsHook's per-module statistics in the order drawn (any other
# statistic found is drawn after them, under its key)
MODULE_PANELS = (
    ('act', 'activation scale (rms)'),
    ('grad_norm', 'gradient norm'),
    ('weight_norm', 'weight norm'),
    ('update_ratio', 'update ratio ||dw|| / ||w||'),
    ('exp_avg_norm', 'first moment ||m||'),
    ('exp_avg_cos', 'cos(grad, m)'),
    ('exp_avg_sq_sqrt_norm', 'second moment ||sqrt(v)||'),
    ('momentum_buffer_norm', 'momentum buffer norm'),
    ('momentum_buffer_cos', 'cos(grad, momentum buffer)'),
)

__all__ = ['main']


def find_scalars(work_dir: str) -> str:
    """The newest ``scalars.json`` under ``work_dir`` (or the file itself):
    the last of :func:`~mmstats.analysis.runs.launches`."""
    return launches(work_dir)[-1]


def epoch_units(scalars_path: str) -> Tuple[bool, bool]:
    """``(validation per epoch, training statistics per epoch)`` from the
    run's ``config.py`` beside ``scalars.json`` (both False without it)."""
    path = osp.join(osp.dirname(scalars_path), 'config.py')
    if not osp.isfile(path):
        return False, False
    from mmengine.config import Config
    cfg = Config.fromfile(path, import_custom_modules=False)
    train_cfg = cfg.get('train_cfg') or {}
    epoch_loop = bool(train_cfg.get('by_epoch')) or 'Epoch' in str(
        train_cfg.get('type', ''))
    val_by_epoch = epoch_loop and (cfg.get('default_hooks') or {}).get(
        'logger', {}).get('log_metric_by_epoch', True)
    stats_by_epoch = any(
        str(h.get('type', '')).endswith('StatsCollectorHook')
        and h.get('by_epoch', False) for h in cfg.get('custom_hooks', []))
    return bool(val_by_epoch), stats_by_epoch


def reported_names(series: Series, prefix: str) -> Dict[str, List[str]]:
    """``{name: [stat, ...]}`` of the keys ``<prefix>/<name>/<stat>``."""
    names: Dict[str, List[str]] = {}
    for key in series:
        if not key.startswith(prefix + '/'):
            continue
        name, _, stat = key[len(prefix) + 1:].rpartition('/')
        if name and (stat in BASE_STATS or QUANTILE.match(stat)):
            names.setdefault(name, []).append(stat)
    return names


def _get(series: Series, key: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    if key not in series:
        return None
    steps, values = series[key]
    return np.asarray(steps, float), np.asarray(values, float)


def draw_name(ax: Any,
              series: Series,
              prefix: str,
              name: str,
              x_label: str,
              log_y: Optional[bool] = None,
              resumed_at: Sequence[int] = ()) -> None:
    """One panel: quantile bands if published, else mean+-std clipped to
    the values' range (and to [0, 1] when every value lies in it)."""
    from matplotlib.ticker import MaxNLocator
    key = f'{prefix}/{name}'
    stats = {
        s: _get(series, f'{key}/{s}')
        for s in reported_names(series, prefix).get(name, [])
    }
    quantiles = sorted((float(QUANTILE.match(s).group(1)), s) for s in stats
                       if QUANTILE.match(s))
    _draw_centre(ax, stats, quantiles)
    for stat, style in (('min', ':'), ('max', '--')):
        if stats.get(stat) is not None:
            ax.plot(*stats[stat], style, color='C1', lw=1, label=stat)
    if log_y is None:  # automatic for losses spanning more than a decade
        centre = stats.get('mean') or (stats.get('p50'))
        values = centre[1] if centre else np.array([])
        log_y = ('loss' in name and values.size > 1 and values.min() > 0
                 and values.max() / values.min() > 10)
    if log_y:
        ax.set_yscale('log')
    if x_label == 'iteration':
        mark_resumes(ax, resumed_at)
    ax.set_title(name)
    ax.set_xlabel(x_label)
    ax.set_ylabel(name.rsplit('/', 1)[-1])
    steps = {s for v in stats.values() if v is not None for s in v[0]}
    if len(steps) == 1:  # one point (one epoch): its step, not fractions
        ax.set_xticks(sorted(steps))
    else:
        ax.xaxis.set_major_locator(MaxNLocator('auto', integer=True))
    ax.grid(alpha=0.3)
    ax.legend(
        fontsize='small',
        loc='upper left',
        bbox_to_anchor=(1.01, 1),
        borderaxespad=0)


def _draw_centre(ax, stats: dict, quantiles: list) -> None:
    """The quantile band and p50 of :func:`draw_name`, or its mean in a
    mean+-std band clipped to the values' range."""
    lo = stats.get('min')
    hi = stats.get('max')
    if len(quantiles) >= 2:
        s_lo, s_hi = quantiles[0][1], quantiles[-1][1]
        steps, low = stats[s_lo]
        ax.fill_between(
            steps,
            low,
            stats[s_hi][1],
            alpha=0.25,
            color='C0',
            label=f'{s_lo}-{s_hi}')
        if 'p50' in stats:
            ax.plot(*stats['p50'], color='C0', label='p50')
    elif 'mean' in stats:
        steps, mean = stats['mean']
        ax.plot(steps, mean, color='C0', label='mean')
        if 'std' in stats:
            std = stats['std'][1]
            low, high = mean - std, mean + std
            if lo is not None and hi is not None:  # never outside the data
                low, high = np.maximum(low, lo[1]), np.minimum(high, hi[1])
            values = np.concatenate([mean] + [s[1] for s in (lo, hi) if s])
            if values.size and values.min() >= 0 and values.max() <= 1:
                low, high = np.clip(low, 0, 1), np.clip(high, 0, 1)
            ax.fill_between(
                steps,
                low,
                high,
                alpha=0.25,
                color='C0',
                label='mean ± std (clipped)')


def module_stats(series: Series, prefix: str,
                 modules_prefix: str) -> List[str]:
    """The per-module statistics in ``series`` (the ``<stat>`` of the keys
    ``<prefix>/<modules_prefix>/<module>/<stat>/mean``), those of
    ``MODULE_PANELS`` first in its order, then any other by name; the
    hook's per-run names (``total_grad_norm``, ``instrument_ms``) are not
    per module."""
    head = f'{prefix}/{modules_prefix}/'
    found = set()
    for key in series:
        if key.startswith(head) and key.endswith('/mean'):
            module, _, stat = key[len(head):-len('/mean')].rpartition('/')
            if module:
                found.add(stat)
    known = [stat for stat, _ in MODULE_PANELS if stat in found]
    return known + sorted(found - set(known))


def module_matrix(series: Series, prefix: str, modules_prefix: str,
                  stat: str) -> Tuple[List[str], np.ndarray, np.ndarray]:
    """``(module names, steps, matrix [modules x steps])`` of a module
    statistic (NaN where missing); ``act`` is the rms sqrt(mean^2+std^2)."""
    head = f'{prefix}/{modules_prefix}/'
    names = sorted({
        k[len(head):].rsplit('/', 2)[0]
        for k in series if k.startswith(head) and k.endswith(f'/{stat}/mean')
    })
    steps = sorted(
        {s
         for n in names
         for s in series[f'{head}{n}/{stat}/mean'][0]})
    matrix = np.full((len(names), len(steps)), np.nan)
    column = {s: i for i, s in enumerate(steps)}
    for row, name in enumerate(names):
        step, mean = _get(series, f'{head}{name}/{stat}/mean')
        value = mean
        std = _get(series, f'{head}{name}/{stat}/std')
        if stat == 'act' and std is not None:
            value = np.sqrt(mean**2 + std[1]**2)
        for s, v in zip(step, value):
            matrix[row, column[s]] = v
    return names, np.asarray(steps, float), matrix


def modules_figure(series: Series,
                   prefix: str,
                   modules_prefix: str,
                   x_label: str = 'iteration',
                   scalars_path: str = '',
                   resumed_at: Sequence[int] = ()) -> Any:
    """The heat maps of ModuleStatsHook's statistics, one per statistic of
    :func:`module_stats` (a matplotlib Figure), titled with the run of
    ``scalars_path``; None without them."""
    described = dict(MODULE_PANELS)
    panels = [(stat, described.get(stat, stat),
               module_matrix(series, prefix, modules_prefix, stat))
              for stat in module_stats(series, prefix, modules_prefix)]
    if not panels:
        return None
    rows = max(len(p[2][0]) for p in panels)
    fig, axes = panel_grid(len(panels), 5.2, 1.6 + 0.25 * rows)
    for ax, (stat, what, matrix) in zip(axes, panels):
        _heat_map(fig, ax, stat, what, matrix, x_label)
        if x_label == 'iteration' and len(matrix[1]):  # between columns
            mark_resumes(ax, [
                np.searchsorted(matrix[1], at, 'right') - 0.5
                for at in resumed_at
            ])
    title(fig, 'ModuleStatsHook' + resumed_text(resumed_at),
          osp.dirname(scalars_path))
    return fig


def _heat_map(fig, ax, stat: str, what: str,
              matrix: Tuple[List[str], np.ndarray,
                            np.ndarray], x_label: str) -> None:
    """One panel of :func:`modules_figure`: a log colour scale where every
    value is positive and the statistic is not a cosine, else linear."""
    from matplotlib.colors import LogNorm, Normalize
    names, steps, values = matrix
    finite = values[np.isfinite(values)]
    log = finite.size > 0 and finite.min() > 0 and not stat.endswith('_cos')
    norm = (LogNorm if log else Normalize)(
        finite.min(), finite.max()) if finite.size else None
    mesh = ax.imshow(
        values,
        norm=norm,
        aspect='auto',
        interpolation='nearest',
        cmap='viridis')
    ax.set_yticks(range(len(names)), names, fontsize='small')
    ax.set_ylabel('module')
    # every k-th column, evenly (rounded linspace labelled uneven ones),
    # and the last (the run's end), without one crowding it
    stride = max(1, -(-len(steps) // 8))
    ticks = [
        t for t in range(0, len(steps), stride)
        if len(steps) - 1 - t >= stride / 2
    ] + [len(steps) - 1]
    ax.set_xticks(ticks, [f'{steps[int(t)]:g}' for t in ticks])
    ax.set_xlabel(x_label)
    only = one_value(finite)
    scale = 'log' if log else 'linear'
    ax.set_title(
        f'{what}: {only:.3g} everywhere'
        if only is not None else f'{what} ({scale} colour scale)',
        fontsize='medium')
    colorbar(fig, mesh, ax, stat, finite)


def names_figure(series: Series,
                 names: List[str],
                 prefix: str,
                 units: Tuple[bool, bool],
                 log_loss: bool = False,
                 scalars_path: str = '',
                 resumed_at: Sequence[int] = ()) -> Any:
    """One panel per reported name (see :func:`draw_name`); a Figure
    titled with the run of ``scalars_path``."""
    val_by_epoch, stats_by_epoch = units
    fig, axes = panel_grid(len(names), 5.0, 3.0)
    for ax, name in zip(axes, names):
        is_val = name.startswith(('val/', 'test/'))
        by_epoch = val_by_epoch if is_val else stats_by_epoch
        draw_name(
            ax,
            series,
            prefix,
            name,
            'epoch' if by_epoch else 'iteration',
            log_y=True if log_loss and 'loss' in name else None,
            resumed_at=resumed_at)
    title(fig, 'StatsCollectorHook' + resumed_text(resumed_at),
          osp.dirname(scalars_path))
    return fig


def main(argv: Optional[list] = None) -> str:
    """Run the script; returns the path of ``stats.png``.

    Example:
        .. code-block:: shell

            python -m mmstats.analysis.plot_stats work_dirs/demo
    """
    parser = figure_parser(__doc__, 'stats.png')
    parser.add_argument(
        '--keys',
        nargs='+',
        help='reported names, e.g. loss model/feat_norm (default: all '
        "but the per-module ones, which modules.png draws)")
    parser.add_argument(
        '--prefix', default='stats', help="StatsCollectorHook's prefix")
    parser.add_argument(
        '--modules-prefix', default='modules', help="ModuleStatsHook's prefix")
    parser.add_argument(
        '--log-loss',
        action='store_true',
        help='log y axis for every loss panel')
    parser.add_argument(
        '--modules-out',
        help='PNG of the module heat maps '
        '(default: modules.png beside --out)')
    args = parser.parse_args(argv)

    import matplotlib
    matplotlib.use('Agg')
    run = load_run(work_dir_of(args.work_dir))  # every launch of the run
    path, series = run.files[-1], run.series
    available = sorted(reported_names(series, args.prefix))
    keys = args.keys or [
        n for n in available
        if not n.startswith(args.modules_prefix + '/') or n.count('/') == 1
    ]
    missing = [k for k in keys if k not in available]
    if missing or not keys:
        raise SystemExit(f'no statistics for {missing or "any name"} in '
                         f'{path}; available: {available}')
    out = args.out or osp.join(osp.dirname(path), 'stats.png')
    units = epoch_units(path)
    save(
        names_figure(series, keys, args.prefix, units, args.log_loss, path,
                     run.resumed_at), out)
    figure = modules_figure(series, args.prefix, args.modules_prefix,
                            'epoch' if units[1] else 'iteration', path,
                            run.resumed_at)
    if figure is not None:
        save(figure, args.modules_out
             or osp.join(osp.dirname(out), 'modules.png'))
    return out


if __name__ == '__main__':
    main()
