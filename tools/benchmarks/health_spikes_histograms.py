"""Benchmark of StatsCollectorHook's spike detection and all-rank
histograms on the digits demo (issue 28, item 6).

Trains the digits demo (``make demo``'s config: ResNet-mini, batch 64, SGD,
the model's four reported names plus the loss and timing; iteration-based
here, without validation and precise BN, so the denominator is training
iterations only) in real mmengine Runners, LoggerHook interval 10, in four
setups, interleaved in every repeat (medians over repeats):

- ``spikes off``: ``StatsCollectorHook(health=dict(spike_regex=None))``
  (the hook as it was before spikes existed);
- ``spikes on``: the defaults (``spike_regex='loss'``, factor 4, window 20);
- ``quantiles+tb``: ``stats=(..., 'p50')`` and a TensorboardVisBackend,
  ``histogram_regex=None``;
- ``histograms``: the same with ``histogram_regex='.*'`` (every name: the
  loss, timing and the model's four, 512 buckets at most each);
- ``loss histogram``: the same with ``histogram_regex='loss'``.

Prints, side by side from this one run: the ratio of the summed training
iteration times (``spikes on / spikes off``, ``histograms /
quantiles+tb``), and the hook's own time in the spike check and in the
histogram writing (ms per publication, timed around those two methods),
as a share of the training time of an interval (the less noisy figure).

Usage: ``python tools/benchmarks/health_spikes_histograms.py [--iters N]
[--repeats R]`` (needs ``pip install -e projects/digits_demo`` and
tensorboard).
"""
import argparse
import os.path as osp
import statistics
import sys
import time
from typing import Dict, List

import torch
from mmengine.runner import Runner
from mmengine.utils import ManagerMixin

import mmstats  # noqa: F401  (registers the hooks)
from mmstats.hooks.stats_collector_hook import StatsCollectorHook

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from module_stats import INTERVAL, demo_cfg  # noqa: E402

MAIN_CONFIG = ('projects/digits_demo/configs/demo/'
               'resnet-mini_1xb64-precise-bn-stats_digits.py')
STATS = ('mean', 'std', 'min', 'max')
SETUPS = {
    'spikes off':
    dict(health=dict(spike_regex=None)),
    'spikes on':
    dict(),
    'quantiles+tb':
    dict(health=dict(spike_regex=None), stats=STATS + ('p50', )),
    'histograms':
    dict(
        health=dict(spike_regex=None, histogram_regex='.*'),
        stats=STATS + ('p50', )),
    'loss histogram':
    dict(
        health=dict(spike_regex=None, histogram_regex='loss'),
        stats=STATS + ('p50', )),
}
TENSORBOARD = ('quantiles+tb', 'histograms', 'loss histogram')


class _Timed:
    """Time two methods of StatsCollectorHook (seconds, per call)."""

    def __init__(self) -> None:
        self.seconds: Dict[str, List[float]] = {}
        self._originals = {}

    def __enter__(self) -> '_Timed':
        for name in ('_check_spikes', '_write_histograms'):
            original = getattr(StatsCollectorHook, name)
            self._originals[name] = original

            def timed(*args, _original=original, _name=name, **kwargs):
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.seconds.setdefault(_name,
                                            []).append(time.perf_counter() -
                                                       start)

            setattr(StatsCollectorHook, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._originals.items():
            setattr(StatsCollectorHook, name, original)


def train(iters: int, setup: str) -> Dict[str, List[float]]:
    """Per-iteration times (s) of one run and the timed methods' calls."""
    cfg = demo_cfg(iters,
                   [dict(type='mmstats.StatsCollectorHook', **SETUPS[setup])],
                   MAIN_CONFIG)
    if setup in TENSORBOARD:
        cfg.visualizer = dict(
            type='Visualizer',
            vis_backends=[
                dict(type='LocalVisBackend'),
                dict(type='TensorboardVisBackend')
            ])
    with _Timed() as timed:
        runner = Runner.from_cfg(cfg)
        runner.train()
        runner.visualizer.close()
    times = list(runner.message_hub.get_scalar('train/time').data[0])
    for cls in ManagerMixin.__subclasses__():
        cls._instance_dict.clear()
    return dict(times=times, **timed.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--iters', type=int, default=300)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.iters, args.repeats = 2 * INTERVAL, 1
    torch.set_num_threads(1)
    warmup = INTERVAL  # the first interval: allocations, first publication
    sums: Dict[str, List[float]] = {setup: [] for setup in SETUPS}
    iteration: List[float] = []
    per_pub: Dict[str, List[float]] = {}
    for _ in range(args.repeats):  # interleaved: drifts hit all alike
        for setup in SETUPS:
            out = train(args.iters, setup)
            sums[setup].append(sum(out['times'][warmup:]))
            if setup == 'spikes off':
                iteration.append(statistics.median(out['times'][warmup:]))
            for name, key in (('spikes on', '_check_spikes'),
                              ('histograms', '_write_histograms'),
                              ('loss histogram', '_write_histograms')):
                if setup == name:
                    per_pub.setdefault(name,
                                       []).append(statistics.median(out[key]))

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(sums[a], sums[b]))

    it = statistics.median(iteration)
    device = 'cuda' if torch.cuda.is_available() else 'cpu, 1 thread'
    print(f'## spikes and histograms on the digits demo (ResNet-mini, batch '
          f'64), {args.iters} iterations, interval {INTERVAL}, {device}, '
          f'median of {args.repeats} interleaved repeats')
    print(f'{"iteration time, spikes off (ms)":58s} {it * 1e3:8.3f}')
    for label, (a, b), key in (
        ('spikes (defaults)', ('spikes on', 'spikes off'), 'spikes on'),
        ("histograms (histogram_regex='.*')", ('histograms', 'quantiles+tb'),
         'histograms'),
        ("histograms (histogram_regex='loss')",
         ('loss histogram', 'quantiles+tb'), 'loss histogram'),
    ):
        ms = statistics.median(per_pub[key]) * 1e3
        print(f'{label + ": training time ratio":58s} '
              f'{100 * (ratio(a, b) - 1):+7.2f}%')
        print(f'{label + ": hook time per publication (ms)":58s} {ms:8.3f}')
        print(f'{label + ": that / training time of an interval":58s} '
              f'{100 * ms / 1e3 / (INTERVAL * it):7.3f}%')


if __name__ == '__main__':
    main()
