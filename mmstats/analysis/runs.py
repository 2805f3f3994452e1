# Copyright (c) mmstats contributors. All rights reserved.
"""A work dir's whole run, across its launches.

mmengine writes one ``WORK_DIR/<timestamp>/`` per launch (its ``.log``,
``vis_data/scalars.json``, the event files). A run interrupted and
resumed (``--resume``, after a preemption or a crash) has several; an
evaluation (``mmstats-test``) in the same work dir adds one more. The
figures of a work dir are of the whole run, which :func:`load_run` reads:

- the *training* launches (a ``scalars.json`` with an ``lr`` record) of the
  run: the newest launch that started from scratch and the resumes after
  it (a launch resumed when its ``.log`` says mmengine's ``resumed epoch:
  E, iter: I``); an older run trained from scratch in the same directory
  is not part of the story. Without any training launch, the newest
  ``scalars.json`` alone;
- a resumed launch's steps replace the interrupted one's overlapping
  steps, key by key: an earlier launch keeps a key's points before the
  first step the later launch wrote for that key, and none after the
  iteration the later launch resumed at (what the interrupted launch
  trained past its checkpoint was thrown away). Validation keyed by epoch
  is cut at the resumed launch's first epoch of it, so no gap and no
  duplicate;
- :attr:`Run.resumed_at`: the iterations the launches resumed at, which
  the figures mark on their iteration axes and name in their titles.

Example:
    >>> series = [{'loss': ([1, 2, 3, 4], [4., 3., 2., 1.])},
    ...           {'loss': ([3, 4, 5], [2.5, 1.5, 1.])}]
    >>> stitch(series, [None, 2])['loss']
    ([1, 2, 3, 4, 5], [4.0, 3.0, 2.5, 1.5, 1.0])
"""
import glob
import json
import os.path as osp
import re
from collections import defaultdict
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

__all__ = [
    'Run', 'load_run', 'launches', 'stitch', 'load_scalars',
    'resumed_iteration', 'mark_resumes', 'resumed_text'
]

Series = Dict[str, Tuple[List[float], List[float]]]
RESUMED = re.compile(r'resumed epoch: (\d+), iter: (\d+)')
TRAINING = re.compile(r' - (Epoch|Iter)\(train\) ')


class Run(NamedTuple):
    """A work dir's run (see :func:`load_run`).

    Example:
        >>> Run({}, [], []).resumed_at
        []
    """
    series: Series  #: ``{key: (steps, values)}`` of the whole run
    resumed_at: List[int]  #: the iterations later launches resumed at
    files: List[str]  #: the ``scalars.json`` files read, oldest first


def load_scalars(path: str) -> Series:
    """Read one ``scalars.json`` (one JSON dict per line) into series.

    Returns:
        dict: ``{key: (steps, values)}`` for every numeric key but ``step``.

    Example:
        .. code-block:: python

            series = load_scalars('work/20260101_120000/vis_data/'
                                  'scalars.json')
    """
    series: Series = defaultdict(lambda: ([], []))
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            step = record.get('step')
            for key, value in record.items():
                if key != 'step' and isinstance(value, (int, float)):
                    series[key][0].append(step)
                    series[key][1].append(value)
    return dict(series)


def resumed_iteration(scalars_path: str) -> Optional[int]:
    """The iteration the launch of ``scalars_path`` resumed at, from its
    ``.log`` (mmengine's ``resumed epoch: E, iter: I``); None for a launch
    that started from scratch (or without a log).

    Example:
        >>> resumed_iteration('/nonexistent/vis_data/scalars.json') is None
        True
    """
    launch = osp.dirname(osp.dirname(osp.abspath(scalars_path)))
    for log in glob.glob(osp.join(launch, '*.log')):
        with open(log, errors='replace') as f:
            for line in f:
                found = RESUMED.search(line)
                if found:
                    return int(found.group(2))
                if TRAINING.search(line):  # said before training, or never
                    break
    return None


def launches(work_dir: str) -> List[str]:
    """The ``scalars.json`` of every launch under ``work_dir``, oldest
    first (timestamp directories sort by time); ``[work_dir]`` where it is
    a file, the one in it where it is a launch's ``vis_data``.

    Raises:
        FileNotFoundError: No ``scalars.json`` under ``work_dir``.

    Example:
        >>> launches('/nonexistent')
        Traceback (most recent call last):
        ...
        FileNotFoundError: no */vis_data/scalars.json under '/nonexistent': is it the --work-dir of a run with LocalVisBackend?
    """  # noqa: E501
    if osp.isfile(work_dir):
        return [work_dir]
    own = osp.join(work_dir, 'scalars.json')
    if osp.isfile(own):
        return [own]
    found = sorted(
        glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not found:
        raise FileNotFoundError(
            f'no */vis_data/scalars.json under {work_dir!r}: is it the '
            '--work-dir of a run with LocalVisBackend?')
    return found


def stitch(parts: Sequence[Series],
           resumed: Sequence[Optional[int]]) -> Series:
    """One series of launches ``parts`` (oldest first); ``resumed[i]`` the
    iteration launch ``i`` resumed at (None: unknown). Each key keeps an
    earlier launch's points before the first step a later launch wrote
    for it and, where that launch's resume iteration is known, none after
    it (see the module's docstring).

    Example:
        >>> stitch([{'acc': ([1, 2], [50., 60.])},
        ...         {'acc': ([2, 3], [61., 70.])}], [None, 30])['acc']
        ([1, 2, 3], [50.0, 61.0, 70.0])
    """
    merged: Series = {}
    for part, at in zip(parts, resumed):
        for key in set(merged) | set(part):
            steps, values = merged.get(key, ([], []))
            later = part.get(key, ([], []))
            first = min(later[0]) if later[0] else float('inf')
            keep = [
                i for i, s in enumerate(steps)
                if s < first and (at is None or s <= at)
            ]
            merged[key] = ([steps[i] for i in keep] + list(later[0]),
                           [values[i] for i in keep] + list(later[1]))
    return {k: v for k, v in merged.items() if v[0]}


def load_run(work_dir: str) -> Run:
    """The whole run of ``work_dir`` (a work dir, a launch's
    ``vis_data`` or one ``scalars.json``; see the module's docstring).

    Example:
        .. code-block:: python

            run = load_run('work_dirs/demo')
            steps, losses = run.series['loss']
    """
    files = launches(work_dir)
    parts = [load_scalars(f) for f in files]
    training = [i for i, part in enumerate(parts) if 'lr' in part]
    if not training:
        return Run(parts[-1], [], files[-1:])
    resumed = [resumed_iteration(files[i]) for i in training]
    start = max([j for j, at in enumerate(resumed) if at is None] or [0])
    chosen = training[start:]
    resumed = resumed[start:]
    resumed[0] = None  # the run's first launch: all of it
    return Run(
        stitch([parts[i] for i in chosen],
               resumed), [at for at in resumed[1:] if at is not None],
        [files[i] for i in chosen])


def mark_resumes(ax: Any, resumed_at: Sequence[int]) -> None:
    """Dotted vertical lines at the iterations a run resumed at, on an
    iteration axis ``ax`` (legend label ``resumed``).

    Example:
        >>> import matplotlib
        >>> matplotlib.use('Agg')
        >>> import matplotlib.pyplot as plt
        >>> fig, ax = plt.subplots()
        >>> mark_resumes(ax, [34])
        >>> [line.get_label() for line in ax.get_lines()]
        ['resumed']
        >>> plt.close(fig)
    """
    for i, at in enumerate(resumed_at):
        ax.axvline(
            at,
            color='grey',
            ls=':',
            lw=1,
            label='resumed' if i == 0 else None)


def resumed_text(resumed_at: Sequence[int]) -> str:
    """What a figure's title adds for a resumed run.

    Example:
        >>> resumed_text([34, 80])
        ' (resumed at iterations 34, 80)'
        >>> resumed_text([])
        ''
    """
    if not resumed_at:
        return ''
    word = 'iteration' if len(resumed_at) == 1 else 'iterations'
    return f' (resumed at {word} ' + ', '.join(map(str, resumed_at)) + ')'
