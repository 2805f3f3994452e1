# Copyright (c) mmstats contributors. All rights reserved.
"""Several work dirs, run against run: one panel per key, one line per
run (each its whole run across launches, ``runs.load_run``), labelled
with the work dir's name; what ``mmstats-plot WORK_DIR WORK_DIR ...``
draws (e.g. the digits demo's EMA statistics against PreciseBNHook).

By default the panels are the training loss and every validation metric
the runs share (``accuracy``...: a key of the records that carry no
``lr``); ``keys`` chooses others (any key of ``scalars.json``, e.g.
``stats/loss/mean``).
"""
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence

from mmstats.analysis.figures import panel_grid
from mmstats.analysis.runs import Run

__all__ = ['default_keys', 'compare_figure']

#: keys of a training record that are not worth a panel of their own
NOT_COMPARED = ('lr', 'time', 'data_time', 'memory', 'epoch', 'iter')


def default_keys(runs: Sequence[Run]) -> List[str]:
    """``loss`` and the validation metrics that every run of ``runs``
    has (keys without a ``/`` that are not training bookkeeping), in
    that order.

    Example:
        >>> a = Run({'loss': ([1], [1.]), 'accuracy': ([1], [50.]),
        ...          'lr': ([1], [.1])}, [], [])
        >>> b = Run({'loss': ([1], [2.]), 'accuracy': ([1], [40.])}, [], [])
        >>> default_keys([a, b])
        ['loss', 'accuracy']
    """
    shared = set.intersection(*(set(run.series) for run in runs))
    metrics = sorted(k for k in shared if '/' not in k and k != 'loss'
                     and k not in NOT_COMPARED and not k.endswith('_time'))
    return (['loss'] if 'loss' in shared else []) + metrics


def compare_figure(runs: Dict[str, Run],
                   keys: Optional[Sequence[str]] = None) -> Any:
    """One panel per key of ``keys`` (default :func:`default_keys`), one
    line per run of ``runs`` (``{label: Run}``); None without a key.

    Example:
        >>> import matplotlib
        >>> matplotlib.use('Agg')
        >>> ema = Run({'accuracy': ([1, 2], [50., 60.])}, [], [])
        >>> precise = Run({'accuracy': ([1, 2], [55., 70.])}, [], [])
        >>> fig = compare_figure({'ema': ema, 'precise_bn': precise})
        >>> [line.get_label() for line in fig.axes[0].get_lines()]
        ['ema', 'precise_bn']
    """
    from matplotlib.ticker import MaxNLocator
    keys = list(keys or default_keys(list(runs.values())))
    if not keys:
        return None
    fig, axes = panel_grid(len(keys), 5.0, 3.2)
    for ax, key in zip(axes, keys):
        for label, run in runs.items():
            if key in run.series:
                steps, values = run.series[key]
                marker = 'o' if len(steps) < 30 else None
                ax.plot(steps, values, marker=marker, ms=3, label=label)
        ax.set_title(key)
        ax.set_xlabel('iteration' if key == 'loss' or '/' in key else
                      'epoch (iteration in iteration loops)')
        ax.set_ylabel(key.rsplit('/', 1)[-1])
        ax.xaxis.set_major_locator(MaxNLocator('auto', integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize='small')
    fig.suptitle('runs compared: ' + ', '.join(runs))
    return fig


def run_label(work_dir: str) -> str:
    """The label of a work dir's run: its directory name.

    Example:
        >>> run_label('work_dirs/precise_bn/')
        'precise_bn'
    """
    return osp.basename(osp.normpath(work_dir))
