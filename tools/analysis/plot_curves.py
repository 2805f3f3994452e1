# Copyright (c) mmstats contributors. All rights reserved.
"""PNG plots from the ``scalars.json`` that mmengine's LocalVisBackend
writes.

    python tools/analysis/plot_curves.py WORK_DIR [--out PNG]

Writes ``WORK_DIR/<timestamp>/vis_data/curves.png`` (beside the newest
run's ``scalars.json``): the training loss and the validation accuracy;
prints ``wrote PATH``. ``tools/train.py`` draws it at the end of a run.
"""
import argparse
import json
import os.path as osp
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from figures import save, title, vis_data_dir  # noqa: E402

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
    fig = curves_figure(load_scalars(scalars_path), scalars_path)
    if fig is None:
        return None
    out_path = out_path or osp.join(osp.dirname(scalars_path), 'curves.png')
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def curves_figure(series: Series, scalars_path: str = ''):
    """The loss and accuracy panels (a Figure, titled with the run of
    ``scalars_path``), or None without either."""
    import matplotlib.pyplot as plt
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
        ax.set_xlabel('step (epoch for val, iteration for train)')
        ax.set_ylabel('accuracy (%)' if key == 'accuracy' else 'loss')
        ax.grid(alpha=0.3)
    title(fig, 'training curves', osp.dirname(scalars_path))
    return fig


def main(argv=None) -> str:
    """Run the script; returns the path of ``curves.png``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('work_dir', help='a work dir or a scalars.json')
    parser.add_argument(
        '--out',
        default=None,
        help="the PNG to write (default: curves.png in the run's vis_data)")
    args = parser.parse_args(argv)
    import matplotlib
    matplotlib.use('Agg')
    scalars = args.work_dir if osp.isfile(args.work_dir) else osp.join(
        vis_data_dir(args.work_dir), 'scalars.json')
    fig = curves_figure(load_scalars(scalars), scalars)
    if fig is None:
        sys.exit(f'no loss or accuracy in {scalars}')
    return save(fig, args.out or osp.join(osp.dirname(scalars), 'curves.png'))


if __name__ == '__main__':
    main()
