# Copyright (c) mmstats contributors. All rights reserved.
"""PNG plots from the ``scalars.json`` that mmengine's LocalVisBackend
writes."""
import json
import os.path as osp
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

Series = Dict[str, Tuple[List[float], List[float]]]


def load_scalars(path: str) -> Series:
    """Read ``scalars.json`` (one JSON dict per line) into series.

    Returns:
        dict: ``{key: (steps, values)}`` for every numeric key but ``step``.
    """
    series: Dict[str, Tuple[List[float],
                            List[float]]] = defaultdict(lambda: ([], []))
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


def plot_training_curves(scalars_path: str,
                         out_path: Optional[str] = None) -> Optional[str]:
    """Plot the training loss and the validation accuracy into a PNG.

    Args:
        scalars_path (str): A ``scalars.json``.
        out_path (str, optional): Where to save the PNG. Defaults to
            ``curves.png`` beside ``scalars_path``.

    Returns:
        str or None: The PNG's path, or None if there was nothing to plot.
    """
    if not osp.isfile(scalars_path):
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    series = load_scalars(scalars_path)
    panels = [(key, series[key]) for key in ('loss', 'accuracy')
              if key in series]
    if not panels:
        return None
    out_path = out_path or osp.join(osp.dirname(scalars_path), 'curves.png')
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.5))
    axes = [axes] if len(panels) == 1 else axes
    for ax, (key, (steps, values)) in zip(axes, panels):
        ax.plot(steps, values, marker='o' if key == 'accuracy' else None)
        ax.set_title('val accuracy (%)' if key == 'accuracy' else 'train loss')
        ax.set_xlabel('step (epoch for val, iteration for train)')
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
