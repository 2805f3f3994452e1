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
"""
import glob
import os
import os.path as osp
from typing import Optional, Sequence

import numpy as np

__all__ = [
    'vis_data_dir', 'run_name', 'title', 'colorbar', 'one_value', 'save'
]


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


def title(fig, what: str, vis_data: str) -> None:
    """Title ``fig`` with ``what`` it shows and the run it is of."""
    fig.suptitle(f'{what}: {run_name(vis_data)}')


def colorbar(fig, mappable, ax, label: str, values: Sequence[float]):
    """A colour bar labelled ``label`` for ``mappable`` beside ``ax``, or
    None (nothing drawn) where the finite ``values`` it colours hold fewer
    than two distinct values."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if np.unique(values[np.isfinite(values)]).size < 2:
        return None
    return fig.colorbar(mappable, ax=ax, pad=0.01, label=label)


def save(fig, path: str) -> str:
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
