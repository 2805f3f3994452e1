# Copyright (c) mmstats contributors. All rights reserved.
"""Plot StatsCollectorHook statistics from a work dir's scalars.json.

    python tools/analysis/plot_stats.py WORK_DIR --keys loss model/feat_norm

For each key, draws the mean with a +-std band and the min/max over steps
(iterations; epochs for by-epoch and validation summaries), one panel per
key, into a PNG.
"""
import argparse
import glob
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))


def find_scalars(work_dir: str) -> str:
    """The newest ``scalars.json`` under ``work_dir`` (or the file itself)."""
    if osp.isfile(work_dir):
        return work_dir
    found = sorted(
        glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not found:
        raise FileNotFoundError(
            f'no */vis_data/scalars.json under {work_dir!r}: is it the '
            '--work-dir of a run with LocalVisBackend?')
    return found[-1]


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('work_dir', help='a work dir or a scalars.json')
    parser.add_argument('--keys', nargs='+', required=True,
                        help='reported names, e.g. loss model/feat_norm')
    parser.add_argument('--prefix', default='stats',
                        help="StatsCollectorHook's prefix")
    parser.add_argument('--out', help='PNG path (default: stats.png beside '
                        'scalars.json)')
    args = parser.parse_args(argv)

    from plot_curves import load_scalars
    path = find_scalars(args.work_dir)
    series = load_scalars(path)
    missing = [k for k in args.keys
               if f'{args.prefix}/{k}/mean' not in series]
    if missing:
        names = sorted({k[len(args.prefix) + 1:].rsplit('/', 1)[0]
                        for k in series if k.startswith(args.prefix + '/')})
        raise SystemExit(f'no statistics for {missing} in {path}; '
                         f'available: {names}')

    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(
        len(args.keys), 1, figsize=(7, 2.6 * len(args.keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], args.keys):
        steps, mean = (np.asarray(v) for v in series[f'{args.prefix}/{key}/mean'])
        ax.plot(steps, mean, label='mean', color='C0')
        std = series.get(f'{args.prefix}/{key}/std')
        if std is not None:
            s = np.asarray(std[1])
            ax.fill_between(steps, mean - s, mean + s, alpha=0.25,
                            color='C0', label='mean +- std')
        for stat, style in (('min', ':'), ('max', '--')):
            values = series.get(f'{args.prefix}/{key}/{stat}')
            if values is not None:
                ax.plot(values[0], values[1], style, color='C1', label=stat)
        ax.set_title(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize='small', loc='best')
    axes[-1, 0].set_xlabel('step')
    fig.tight_layout()
    out = args.out or osp.join(osp.dirname(path), 'stats.png')
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f'plot: {out}')
    return out


if __name__ == '__main__':
    main()
