# Copyright (c) mmstats contributors. All rights reserved.
"""Plot what ThroughputHook published, from a run's scalars.json.

    python tools/analysis/plot_throughput.py WORK_DIR [--out PNG]

Writes ``throughput.png``: samples per second (and MFU where it was
published, on its own axis) and the peak memory of every interval (CUDA
allocated and reserved, or the CPU peak RSS), each point marked with the
rank that held the peak. The x axis is the iteration each publication ends
at; each point covers the iterations since the previous one.
"""
import argparse
import os.path as osp
import sys
from typing import Optional

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from plot_curves import load_scalars  # noqa: E402
from plot_stats import find_scalars  # noqa: E402

MEMORY = (('memory/max_allocated', 'CUDA allocated'),
          ('memory/max_reserved', 'CUDA reserved'), ('memory/max_rss',
                                                     'peak RSS (since start)'))


def plot_throughput(scalars_path: str,
                    out_path: Optional[str] = None) -> Optional[str]:
    """Draw the PNG; returns its path, or None without ThroughputHook's
    keys in ``scalars_path``."""
    series = load_scalars(scalars_path)
    if 'throughput/samples_per_s' not in series and not any(
            key in series for key, _ in MEMORY):
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 5.5), sharex=True, constrained_layout=True)
    if 'throughput/samples_per_s' in series:
        steps, values = series['throughput/samples_per_s']
        top.plot(steps, values, 'o-', color='C0', label='samples/s')
        top.set_ylabel('samples / s (all ranks)')
        top.set_ylim(bottom=0)
    if 'throughput/mfu' in series:
        right = top.twinx()
        steps, values = series['throughput/mfu']
        right.plot(
            steps, [100 * v for v in values], 's--', color='C3', label='MFU')
        right.set_ylabel('MFU (%)', color='C3')
        right.set_ylim(bottom=0)
    top.set_title('throughput of each interval')
    ranks_seen = set()
    for i, (key, label) in enumerate(MEMORY):
        if key not in series:
            continue
        steps, values = series[key]
        bottom.plot(steps, values, '-', color=f'C{i + 1}', label=label)
        ranks = series.get(f'{key}_rank', ([], []))[1]
        if len(ranks) == len(values):
            ranks_seen.update(int(r) for r in ranks)
            bottom.scatter(
                steps,
                values,
                c=ranks,
                cmap='viridis',
                vmin=0,
                vmax=max(max(ranks), 1),
                zorder=3,
                s=18)
    if ranks_seen:
        mappable = matplotlib.cm.ScalarMappable(
            norm=matplotlib.colors.Normalize(0, max(max(ranks_seen), 1)),
            cmap='viridis')
        fig.colorbar(
            mappable,
            ax=bottom,
            ticks=sorted(ranks_seen),
            label='rank holding the peak')
    bottom.set_ylabel('peak memory (MiB, max over ranks)')
    bottom.set_xlabel('iteration (the end of each interval)')
    bottom.legend(loc='lower right')
    out_path = out_path or osp.join(
        osp.dirname(scalars_path), 'throughput.png')
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('work_dir', help='a work dir or a scalars.json')
    parser.add_argument('--out', default=None, help='the PNG to write')
    args = parser.parse_args()
    path = plot_throughput(find_scalars(args.work_dir), args.out)
    if path is None:
        sys.exit(f'no ThroughputHook keys in {args.work_dir}')
    print(path)


if __name__ == '__main__':
    main()
