# Copyright (c) mmstats contributors. All rights reserved.
"""All-rank histograms written with mmengine's TensorBoard and W&B
backends: mmengine's ``Visualizer`` has no histogram call, so rank 0's
backends' own writers are used (``add_histogram_raw``,
``wandb.Histogram``). See ``docs/spikes_histograms.md``.
"""
import logging
from typing import Any, List

from mmengine.dist import is_main_process
from mmengine.logging import print_log
from mmengine.visualization import TensorboardVisBackend, WandbVisBackend

from .histograms import Histogram, numpy_histogram

__all__ = ['histogram_writers', 'add_histogram']


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
