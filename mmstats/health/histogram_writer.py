# Copyright (c) mmstats contributors. All rights reserved.
"""All-rank histograms written with mmengine's TensorBoard and W&B
backends: mmengine's ``Visualizer`` has no histogram call, so rank 0's
backends' own writers are used (``add_histogram_raw``,
``wandb.Histogram``). See ``docs/spikes_histograms.md``.
"""
import logging
from typing import Any, Callable, Dict, List

from mmengine.dist import is_main_process
from mmengine.logging import print_log
from mmengine.visualization import TensorboardVisBackend, WandbVisBackend

from .histograms import Histogram, numpy_histogram, sketch_histogram

__all__ = ['histogram_writers', 'add_histogram', 'write_histograms']


def histogram_writers(visualizer: Any,
                      owner: str = 'StatsCollectorHook') -> List[Any]:
    """Rank 0's TensorBoard and W&B backends of ``visualizer`` (none on
    other ranks); a warning (as ``owner``) where there is none.

    Example:
        >>> from types import SimpleNamespace
        >>> from mmengine.visualization import TensorboardVisBackend
        >>> backend = TensorboardVisBackend(save_dir='unused')  # lazy
        >>> visualizer = SimpleNamespace(_vis_backends={'tb': backend})
        >>> histogram_writers(visualizer) == [backend]
        True
    """
    if not is_main_process():
        return []
    backends = getattr(visualizer, '_vis_backends', None) or {}
    writers = [
        b for b in backends.values()
        if isinstance(b, (TensorboardVisBackend, WandbVisBackend))
    ]
    if not writers:
        print_log(
            f'{owner}: histogram_regex is set but the visualizer '
            'has no TensorboardVisBackend or WandbVisBackend, so no '
            'histogram is written (the quantile scalars are); add one, e.g. '
            'visualizer=dict(type=\'Visualizer\', vis_backends=[dict(type='
            '\'LocalVisBackend\'), dict(type=\'TensorboardVisBackend\')])',
            'current',
            level=logging.WARNING)
    return writers


def add_histogram(backend: Any, tag: str, hist: Histogram, step: int) -> None:
    """Write ``hist`` with a TensorBoard backend's writer, or with a W&B
    backend's run (joining the scalars that the visualizer commits next).

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> logged = []
        >>> run = SimpleNamespace(  # stands in for a W&B backend's run
        ...     Histogram=lambda np_histogram: np_histogram,
        ...     log=lambda data, commit: logged.append((data, commit)))
        >>> hist = Histogram(1., 3., 2., 4., 10., np.array([1., 3.]),
        ...                  np.array([1., 1.]))
        >>> add_histogram(SimpleNamespace(experiment=run), 'x/hist', hist, 5)
        >>> [(list(data), commit) for data, commit in logged]
        [(['x/hist'], False)]
    """
    writer = backend.experiment
    if isinstance(backend, TensorboardVisBackend):
        writer.add_histogram_raw(tag, *hist, global_step=step)
    else:  # W&B: joins the scalars that the visualizer commits next
        writer.log({tag: writer.Histogram(np_histogram=numpy_histogram(hist))},
                   commit=False)


def write_histograms(backends: List[Any], collector: Any, results: Dict[str,
                                                                        dict],
                     wanted: Callable[[str], bool], source: Callable[[str],
                                                                     str],
                     prefix: str, max_buckets: int, step: int) -> None:
    """Write, with each of ``backends``, the all-rank histogram of every
    published name of ``results`` that is ``wanted`` and got values in
    ``collector``'s last update, as ``<prefix><name>/hist``.

    Args:
        backends (list): :func:`histogram_writers`.
        collector (Collector): The collector that published ``results``
            (it keeps the merged sketches).
        results (dict[str, dict]): ``{name: {stat: value}}`` (``num``,
            ``mean``, ``std``, ``min``, ``max``).
        wanted (Callable[[str], bool]): Which names get a histogram.
        source (Callable[[str], str]): The collector's name of a name.
        prefix (str): Of the tags.
        max_buckets (int): At most this many buckets per histogram.
        step (int): The step the histograms are written at.

    Example:
        >>> from mmstats import Collector, report
        >>> collector = Collector(sketch=True)
        >>> _ = report('x', 1.), report('x', 4.)
        >>> collector.update()
        >>> tags = []
        >>> backend = type('Run', (), {})()  # stands in for a W&B backend
        >>> backend.experiment = type('Wandb', (), dict(
        ...     Histogram=lambda self, np_histogram: np_histogram,
        ...     log=lambda self, data, commit: tags.extend(data)))()
        >>> write_histograms([backend], collector, collector.as_dict(),
        ...                  lambda name: True, str, 'stats/', 512, 1)
        >>> tags
        ['stats/x/hist']
    """
    for name, values in results.items():
        origin = source(name)
        if not (wanted(name) and collector.is_new(origin)):
            continue
        sketch = collector.sketch(origin)
        hist = None if sketch is None else sketch_histogram(
            sketch, values['num'], values['mean'], values['std'],
            values['min'], values['max'], max_buckets)
        if hist is None:
            continue
        for backend in backends:
            add_histogram(backend, f'{prefix}{name}/hist', hist, step)
