# Copyright (c) mmstats contributors. All rights reserved.
"""What the plot tools of ``tools/analysis`` share: where a run's figures
go, the line that says so, a title per figure and colour bars that say
something.

- Figures go to the run's ``vis_data/`` directory (``WORK_DIR/<timestamp>/
  vis_data/``, beside ``scalars.json`` and the TensorBoard event files),
  the newest run's when a work dir is given (:func:`vis_data_dir`).
- Every tool prints ``wrote PATH`` for each file it writes (:func:`save`).
- Every figure has a title naming what it shows and the run
  (:func:`title`).
- A colour bar has a label, and is drawn only where its colours take two
  values or more (:func:`colorbar`): a one-colour bar says nothing, the
  caller says the one value in words.
- Panels sit in a grid, never in one tall column: :func:`panel_grid`
  picks the columns so that the figure is at most ``MAX_ASPECT`` (2.5)
  times as tall as it is wide, and lays it out with matplotlib's
  constrained layout, which keeps room for the figure's title, the
  legends and the colour bars.
- Every figure can be read at a glance, which :func:`layout_problems`
  checks on the drawn figure (the tests of every tool call it): no two
  texts overlap, none is cut by the figure's edge, the figure is not too
  tall and every panel has a y-axis label.

Example:
    >>> import matplotlib
    >>> matplotlib.use('Agg')
    >>> import matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots()
    >>> mesh = ax.imshow([[1., 1.], [1., 1.]])
    >>> colorbar(fig, mesh, ax, 'rank', [1., 1.]) is None  # one value
    True
    >>> run_name('work_dirs/demo/20260101_120000/vis_data')
    'demo/20260101_120000'
    >>> fig, axes = panel_grid(7, 4.0, 3.0)  # 3 columns, 3 rows
    >>> len(axes), fig.get_size_inches().tolist()
    (7, [12.0, 9.0])
    >>> for ax in axes:
    ...     _ = ax.set(title='a panel', xlabel='step', ylabel='value')
    >>> layout_problems(fig)
    []
    >>> _ = fig.text(0.5, 0.5, 'a panel')  # over the panels' texts?
    >>> _ = fig.text(0.5, 0.5, 'planted')  # surely over this one
    >>> layout_problems(fig)[-1]
    "'a panel' (figure) overlaps 'planted' (figure)"
    >>> plt.close('all')
"""
import argparse
import glob
import math
import os
import os.path as osp
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ['grid_shape', 'panel_grid', 'layout_problems', 'MAX_ASPECT']

MAX_ASPECT = 2.5  # the most a figure's height may be, in widths


def vis_data_dir(path: str) -> str:
    """The ``vis_data`` directory of the newest run under the work dir
    ``path``; ``path`` itself where it is one (it holds ``scalars.json`` or
    event files), the directory of ``path`` where it is a file.

    Raises:
        FileNotFoundError: Nothing of a run under ``path``.
    """
    if osp.isfile(path):
        return osp.dirname(osp.abspath(path))
    if osp.basename(osp.normpath(path)) == 'vis_data' or glob.glob(
            osp.join(path, 'scalars.json')) or glob.glob(
                osp.join(path, 'events.out.tfevents.*')):
        return path
    runs = sorted(glob.glob(osp.join(path, '*', 'vis_data')))
    if not runs:
        raise FileNotFoundError(
            f'no */vis_data under {path!r}: is it the --work-dir of a run '
            'with LocalVisBackend or TensorboardVisBackend?')
    return runs[-1]


def run_name(vis_data: str) -> str:
    """``<work dir name>/<timestamp>`` of a run's ``vis_data`` directory
    (the directory's own name for another directory)."""
    path = osp.normpath(osp.abspath(vis_data))
    if osp.basename(path) != 'vis_data':
        return osp.basename(path)
    run = osp.dirname(path)
    return f'{osp.basename(osp.dirname(run))}/{osp.basename(run)}'


def figure_parser(doc: str,
                  png: str,
                  source: str = 'a work dir or a scalars.json'
                  ) -> argparse.ArgumentParser:
    """The command line every plot tool starts from: its description (the
    first line of ``doc``), ``work_dir`` (``source``) and ``--out`` (the
    PNG, default ``png`` in the run's ``vis_data``); a tool adds its own.

    Example:
        >>> parser = figure_parser('Draw a run.\\n...', 'curves.png')
        >>> args = parser.parse_args(['work_dirs/demo'])
        >>> args.work_dir, args.out
        ('work_dirs/demo', None)
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument('work_dir', help=source)
    parser.add_argument(
        '--out',
        default=None,
        help=f"the PNG to write (default: {png} in the run's vis_data)")
    return parser


def title(fig: Any, what: str, vis_data: str) -> None:
    """Title ``fig`` with ``what`` it shows and the run it is of."""
    fig.suptitle(f'{what}: {run_name(vis_data)}')


def colorbar(fig: Any, mappable: Any, ax: Any, label: str,
             values: Sequence[float]) -> Any:
    """A colour bar labelled ``label`` for ``mappable`` beside ``ax``, or
    None (nothing drawn) where the finite ``values`` it colours hold fewer
    than two distinct values."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if np.unique(values[np.isfinite(values)]).size < 2:
        return None
    bar = fig.colorbar(mappable, ax=ax, pad=0.01, label=label)
    norm = mappable.norm
    if type(norm).__name__ == 'LogNorm' and norm.vmin > 0:
        _log_ticks(bar, np.log10(norm.vmax / norm.vmin))
    return bar


def _log_ticks(bar, decades: float) -> None:
    """Label a log colour bar's decades only; 1, 2 and 5 times them where
    it spans under two decades; three round values where under half a
    decade. No minor labels: matplotlib's defaults label some, and fall
    back to many linear ticks on a narrow range, which collide on a short
    bar."""
    from matplotlib.ticker import (FuncFormatter, LogLocator, MaxNLocator,
                                   NullFormatter)
    axis = bar.ax.yaxis if bar.orientation == 'vertical' else bar.ax.xaxis
    if decades >= 2:
        axis.set_major_locator(LogLocator())
    else:
        axis.set_major_locator(
            LogLocator(subs=(1.0, 2.0,
                             5.0)) if decades >= 0.5 else MaxNLocator(3))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f'{v:.3g}'))
    axis.set_minor_formatter(NullFormatter())


def save(fig: Any, path: str) -> str:
    """Write ``fig`` to ``path`` (its directory made), close it, print
    ``wrote PATH``; returns ``path``."""
    import matplotlib.pyplot as plt
    directory = osp.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f'wrote {path}', flush=True)
    return path


def one_value(values: Sequence[float]) -> Optional[float]:
    """The value of ``values`` if its finite ones are all the same, else
    None (see :func:`colorbar`)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    distinct = np.unique(values[np.isfinite(values)])
    return float(distinct[0]) if distinct.size == 1 else None


def grid_shape(n: int, width: float, height: float) -> Tuple[int, int]:
    """``(rows, columns)`` of ``n`` panels of ``width`` x ``height``
    inches: about sqrt(n) columns, at least 3 (at most n), and more where
    the grid would be over ``MAX_ASPECT`` times as tall as wide.

    Example:
        >>> grid_shape(1, 4, 3), grid_shape(2, 4, 3), grid_shape(11, 4, 3)
        ((1, 1), (1, 2), (4, 3))
        >>> grid_shape(4, 1, 10)  # tall panels: side by side
        (1, 4)
    """
    cols = min(n, max(3, round(math.sqrt(n))))
    while cols < n and math.ceil(n / cols) * height > \
            MAX_ASPECT * cols * width:
        cols += 1
    return math.ceil(n / cols), max(cols, 1)


def panel_grid(n: int, width: float, height: float) -> Tuple[Any, list]:
    """A figure of ``n`` panels of about ``width`` x ``height`` inches in
    the grid of :func:`grid_shape`, with matplotlib's constrained layout
    (room kept for the title, legends and colour bars); the cells past the
    ``n``-th are removed.

    Returns:
        tuple: ``(figure, [Axes] * n)``, the panels row by row.

    Example:
        .. code-block:: python

            fig, axes = panel_grid(7, 4.0, 3.0)  # see the module's example
            assert layout_problems(fig) == []
    """
    import matplotlib.pyplot as plt
    rows, cols = grid_shape(n, width, height)
    fig, axes = plt.subplots(
        rows,
        cols,
        squeeze=False,
        figsize=(width * cols, height * rows),
        layout='constrained')
    axes = list(axes.ravel())
    for ax in axes[n:]:
        fig.delaxes(ax)
    return fig, axes[:n]


def drawn_texts(fig: Any) -> List[Tuple[str, str, object]]:
    """``[(text, where, window extent), ...]`` of every text ``fig`` draws
    (non-empty and visible, its artists above visible too): the figure's
    title, the panels' titles, axis labels, offset texts and the labels of
    the ticks drawn (those within the view limits), legend texts, colour
    bar labels and ticks; ``where`` names the panel (its title) or
    colour bar holding it, or ``'figure'``. Draws ``fig`` first, so the
    extents are those of the saved picture (at ``fig.dpi``, in pixels)."""
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.text import Text
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found: List[Tuple[str, str, object]] = []

    def walk(artist, where: str) -> None:
        if not artist.get_visible():
            return
        if isinstance(artist, Text):
            text = artist.get_text()
            if text.strip():
                found.append((text, where, artist.get_window_extent(renderer)))
            return
        children = artist.get_children()
        if isinstance(artist, Axis):  # only the ticks it draws
            children = [artist.label, artist.offsetText] + [
                label for tick in artist._update_ticks()
                for label in (tick.label1, tick.label2)
            ]
        if isinstance(artist, Axes):
            where = 'colour bar of ' if hasattr(artist, '_colorbar') else ''
            where += 'panel ' + repr(artist.get_title() or artist.get_ylabel()
                                     or fig.axes.index(artist))
        for child in children:
            walk(child, where)

    walk(fig, 'figure')
    return found


def layout_problems(fig: Any, tolerance: float = 0.5) -> List[str]:
    """What keeps ``fig`` from being read at a glance, in words; ``[]``
    where nothing does.

    - a pair of texts of :func:`drawn_texts` whose boxes overlap (by more
      than ``tolerance`` pixels both ways): every pair, tick labels
      included;
    - a text reaching past the figure's edge (by more than ``tolerance``);
    - a figure more than ``MAX_ASPECT`` times as tall as wide;
    - a visible panel without a y-axis label (a colour bar: without a
      label on its long axis).

    It lives here, beside the code that lays the figures out, so that each
    tool's test checks its figures the same way
    (``tests/test_tools/test_plot_*.py`` render them from a real run's
    output).

    Example:
        .. code-block:: python

            fig, axes = panel_grid(7, 4.0, 3.0)  # see the module's example
            assert layout_problems(fig) == []
    """
    texts = [(f'{text!r} ({where})', extent)
             for text, where, extent in drawn_texts(fig)]
    problems = []
    box = np.array([[b.x0, b.y0, b.x1, b.y1] for _, b in texts]).reshape(-1, 4)
    wide = np.minimum(box[:, None, 2], box[None, :, 2]) - np.maximum(
        box[:, None, 0], box[None, :, 0])
    high = np.minimum(box[:, None, 3], box[None, :, 3]) - np.maximum(
        box[:, None, 1], box[None, :, 1])
    for i, j in zip(
            *np.nonzero(np.triu((wide > tolerance) & (high > tolerance), 1))):
        problems.append(f'{texts[i][0]} overlaps {texts[j][0]}')
    edge = fig.bbox
    for (name, _), (x0, y0, x1, y1) in zip(texts, box):
        if (x0 < edge.x0 - tolerance or y0 < edge.y0 - tolerance
                or x1 > edge.x1 + tolerance or y1 > edge.y1 + tolerance):
            problems.append(f'{name} is cut by the figure\'s edge')
    if fig.get_figheight() > MAX_ASPECT * fig.get_figwidth():
        problems.append(f'{fig.get_figwidth():g} x {fig.get_figheight():g}'
                        f' inches: over {MAX_ASPECT} times as tall as wide')
    for index, ax in enumerate(fig.axes):
        bar = getattr(ax, '_colorbar', None)
        label = ax.get_xlabel() if bar is not None and \
            bar.orientation == 'horizontal' else ax.get_ylabel()
        if ax.get_visible() and ax.yaxis.get_visible() and \
                not label.strip():
            problems.append(f'panel {ax.get_title() or index!r} has no '
                            'y-axis label')
    return problems
