# Copyright (c) mmstats contributors. All rights reserved.
"""PNG plots from the ``scalars.json`` that mmengine's LocalVisBackend
writes.

    python tools/analysis/plot_curves.py WORK_DIR [--out PNG]

Writes ``WORK_DIR/<timestamp>/vis_data/curves.png`` (beside the newest
launch's ``scalars.json``): the training loss and the validation accuracy
of the whole run, across its launches (``runs.load_run``: a resumed run's
launches joined, the resumes marked); prints ``wrote PATH``.
``mmstats-train`` draws it at the end of a run, ``mmstats-plot`` with the
other figures.
"""
import os.path as osp
import sys
from typing import Any, Optional, Sequence

from mmstats.analysis.figures import figure_parser, save, title
from mmstats.analysis.runs import (Series, load_run, load_scalars,
                                   mark_resumes, resumed_text)

__all__ = [
    'plot_training_curves', 'curves_figure', 'work_dir_of', 'load_scalars',
    'Series'
]


def plot_training_curves(scalars_path: str,
                         out_path: Optional[str] = None) -> Optional[str]:
    """Plot the training loss and the validation accuracy of the whole
    run into a PNG.

    Args:
        scalars_path (str): A work dir, or a launch's ``scalars.json``
            (the run of its work dir is drawn).
        out_path (str, optional): Where to save the PNG. Defaults to
            ``curves.png`` beside the newest launch's ``scalars.json``.

    Returns:
        str or None: The PNG's path, or None if there was nothing to plot.

    Example:
        .. code-block:: python

            plot_training_curves('work_dirs/demo')
    """
    if not osp.exists(scalars_path):
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    run = load_run(work_dir_of(scalars_path))
    fig = curves_figure(run.series, run.files[-1], run.resumed_at)
    if fig is None:
        return None
    out_path = out_path or osp.join(osp.dirname(run.files[-1]), 'curves.png')
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def work_dir_of(path: str) -> str:
    """The work dir of a launch's ``WORK_DIR/<timestamp>/vis_data/
    scalars.json`` (``path`` itself otherwise).

    Example:
        >>> work_dir_of('w/20260101_120000/vis_data/scalars.json')
        'w'
        >>> work_dir_of('w')
        'w'
    """
    parts = osp.normpath(path).split(osp.sep)
    if len(parts) >= 3 and parts[-2:] == ['vis_data', 'scalars.json']:
        return osp.sep.join(parts[:-3]) or '.'
    return path


def curves_figure(series: Series,
                  scalars_path: str = '',
                  resumed_at: Sequence[int] = ()) -> Any:
    """The loss and accuracy panels (a Figure, titled with the run of
    ``scalars_path`` and where it was resumed), or None without either.

    Example:
        >>> import matplotlib
        >>> matplotlib.use('Agg')
        >>> fig = curves_figure({'loss': ([1, 2, 3], [2., 1., .5])}, '', [2])
        >>> fig.get_suptitle().startswith(
        ...     'training curves (resumed at iteration 2): ')
        True
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    panels = [(key, series[key]) for key in ('loss', 'accuracy')
              if key in series]
    if not panels:
        return None
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5 * len(panels), 3.5), layout='constrained')
    axes = [axes] if len(panels) == 1 else axes
    for ax, (key, (steps, values)) in zip(axes, panels):
        ax.plot(steps, values, marker='o' if key == 'accuracy' else None)
        ax.set_title('val accuracy (%)' if key == 'accuracy' else 'train loss')
        ax.set_xlabel('epoch (iteration in iteration loops)' if key ==
                      'accuracy' else 'iteration')
        ax.set_ylabel('accuracy (%)' if key == 'accuracy' else 'loss')
        ax.xaxis.set_major_locator(MaxNLocator('auto', integer=True))
        if key != 'accuracy':
            mark_resumes(ax, resumed_at)
        ax.grid(alpha=0.3)
    title(fig, 'training curves' + resumed_text(resumed_at),
          osp.dirname(scalars_path))
    return fig


def main(argv: Optional[list] = None) -> str:
    """Run the script; returns the path of ``curves.png``.

    Example:
        .. code-block:: shell

            python -m mmstats.analysis.plot_curves work_dirs/demo
    """
    args = figure_parser(__doc__, 'curves.png').parse_args(argv)
    import matplotlib
    matplotlib.use('Agg')
    run = load_run(work_dir_of(args.work_dir))
    scalars = run.files[-1]
    fig = curves_figure(run.series, scalars, run.resumed_at)
    if fig is None:
        sys.exit(f'no loss or accuracy in {scalars}')
    return save(fig, args.out or osp.join(osp.dirname(scalars), 'curves.png'))


if __name__ == '__main__':
    main()
