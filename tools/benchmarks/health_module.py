"""Benchmark of ModuleStatsHook's health options on the digits demo:
``optimizer_state=True`` (norms of the optimizer's moments on the
instrumented iterations) and ``watch_nonfinite=True`` (a NaN/inf check of
every matched module's outputs and gradients on every iteration).

Trains the iteration-based digits demo (ResNet-mini, batch 64, LoggerHook
interval 10, ``projects/digits_demo``) in real Runners, with
StatsCollectorHook and ``ModuleStatsHook(modules=<the demo's stem, stages
and head>)`` in every setup, and each option switched on alone; setups
alternate in every repeat (interleaved) and the ratios are medians over
the repeats. Each iteration is timed twice: by the CPU time of the
training thread (``time.thread_time`` from the first ``before_train_iter``
to the last ``after_train_iter``, one torch thread: what the run itself
spent, little disturbed by other processes on a shared machine) and by
mmengine's wall-clock ``train/time``. Prints side by side, per setup and
for both clocks: the median iteration time, the whole-run ratio to the
baseline (the hook with both options off) and the per-position estimate
(median time at each position of the publication interval, with minus
without, summed: it catches a cost wherever it lands). ``--optimizer
adamw`` trains with AdamW (exp_avg and exp_avg_sq) instead of the demo's
SGD with momentum (momentum_buffer). Beside the clocks, each option's
own host time is printed: ``time.perf_counter`` around each of its
functions (``OWN_FUNCTIONS``: the watch's notes of the outputs and
gradients and its batched checks; the moment sums and their report),
plus, for an option that publishes names of its own (``ADDS_NAMES``),
StatsCollectorHook's publication (``_publish``) time over the
baseline's. Per iteration and as a share of the baseline's iteration: on a
shared machine the differences of whole runs do not resolve 1 %, these
do.

Usage: ``python tools/benchmarks/health_module.py [--iters N]
[--repeats R] [--optimizer sgd|adamw]``
"""
import argparse
import contextlib
import os.path as osp
import statistics
import sys
import time
from typing import Dict, List

import torch
from mmengine.hooks import Hook
from mmengine.utils import ManagerMixin

from mmstats.health import NonfiniteWatch
from mmstats.hooks.stats_collector_hook import StatsCollectorHook
from mmstats.module_stats import ActivationProbes, StepProbe, norms

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from module_stats import DEMO_MODULES, INTERVAL, demo_runner  # noqa: E402

SETUPS = {
    'StatsCollectorHook alone': None,
    'ModuleStatsHook, options off (baseline)': {},
    'optimizer_state=True': dict(optimizer_state=True),
    'watch_nonfinite=True': dict(watch_nonfinite=True),
}
BASELINE = 'ModuleStatsHook, options off (baseline)'
PUBLICATION = ((StatsCollectorHook, ('_publish', )), )
#: the options that publish names of their own
ADDS_NAMES = ('optimizer_state=True', )
#: each option's own functions (nested calls are counted once);
#: ActivationProbes.record on the iterations it runs for the watch only (on
#: the instrumented ones it reports the outputs, as in the baseline)
OWN_FUNCTIONS = {
    'optimizer_state=True':
    ((StepProbe, ('_moment_sums', )), (norms, ('moment_norms', ))),
    'watch_nonfinite=True':
    ((NonfiniteWatch, ('begin_iteration', 'forward', 'end_iteration',
                       'backward_parts', '_fold')),
     (StepProbe, ('_watch_grads', )), (ActivationProbes, ('record', ),
                                       lambda probes: not probes.armed)),
}


@contextlib.contextmanager
def timed(functions, spent: List[float]):
    """Add the host seconds spent in ``functions`` (``((cls, names[,
    when]), ...)``: ``when(self)`` decides per call, if given) to
    ``spent[0]`` (nested calls counted once)."""
    originals = []
    depth = [0]

    def timer(function, when):

        def wrapper(self, *args, **kwargs):
            if when is not None and not when(self):
                return function(self, *args, **kwargs)
            depth[0] += 1
            start = time.perf_counter()
            try:
                return function(self, *args, **kwargs)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    spent[0] += time.perf_counter() - start

        return wrapper

    for cls, names, *when in functions:
        for name in names:
            originals.append((cls, name, getattr(cls, name)))
            setattr(cls, name, timer(getattr(cls, name), *when or (None, )))
    try:
        yield
    finally:
        for cls, name, function in originals:
            setattr(cls, name, function)


class ThreadTime(Hook):
    """CPU time of the training thread per iteration: started by the
    copy of priority HIGHEST, stopped by the one of priority LOWEST."""

    def __init__(self, priority: str, times: List[float]) -> None:
        self.priority = priority
        self.times = times

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self.priority == 'HIGHEST':
            self.times.append(-time.thread_time())

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        if self.priority == 'LOWEST':
            self.times[-1] += time.thread_time()


def train(iters: int, setup: str, optimizer: str) -> dict:
    """Per-iteration CPU and wall times (s) of one demo run of ``setup``,
    and the host seconds per iteration spent in the setup's own functions
    and in the publication."""
    options = SETUPS[setup]
    hooks = [dict(type='mmstats.StatsCollectorHook')]
    if options is not None:
        hooks.append(
            dict(
                type='mmstats.ModuleStatsHook',
                modules=DEMO_MODULES,
                **options))
    runner = demo_runner(iters, hooks)
    if optimizer == 'adamw':
        from mmengine.optim import build_optim_wrapper
        runner.optim_wrapper = build_optim_wrapper(
            runner.model,
            dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05)))
    cpu: List[float] = []
    runner.register_hook(ThreadTime('HIGHEST', cpu), 'HIGHEST')
    runner.register_hook(ThreadTime('LOWEST', cpu), 'LOWEST')
    own, publication = [0.0], [0.0]
    with timed(OWN_FUNCTIONS.get(setup, ()), own), \
            timed(PUBLICATION, publication):
        runner.train()
    wall = list(runner.message_hub.get_scalar('train/time').data[0])
    for cls in ManagerMixin.__subclasses__():
        cls._instance_dict.clear()
    return dict(
        cpu=cpu,
        wall=wall,
        own=own[0] / iters,
        publication=publication[0] / iters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--iters', type=int, default=200)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--optimizer', choices=['sgd', 'adamw'], default='sgd')
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.iters, args.repeats = 2 * INTERVAL, 1
    torch.set_num_threads(1)
    warmup = INTERVAL  # the first interval: allocations, first publication
    runs: Dict[str, List[Dict[str, List[float]]]] = {n: [] for n in SETUPS}
    for repeat in range(args.repeats):  # interleaved, order rotated
        names = list(SETUPS)
        names = names[repeat % len(names):] + names[:repeat % len(names)]
        for name in names:
            runs[name].append(train(args.iters, name, args.optimizer))
    device = 'cuda' if torch.cuda.is_available() else 'cpu, 1 thread'
    print(f'## digits demo ({args.optimizer}), {args.iters} iterations, '
          f'interval {INTERVAL}, {device}, medians of {args.repeats} '
          'interleaved repeats; ratios to the baseline')
    for clock in ('cpu', 'wall'):
        print(f'\n{clock} time')
        report(runs, clock, warmup)
    print('\nown host time per iteration (median of the repeats; first '
          'interval included), as a share of the baseline\'s CPU time per '
          'iteration')
    base = [statistics.median(run['cpu'][warmup:]) for run in runs[BASELINE]]
    for name in OWN_FUNCTIONS:
        # the extra names' publication: only an option that adds names
        extra = [
            run['publication'] -
            b['publication'] if name in ADDS_NAMES else 0.0
            for run, b in zip(runs[name], runs[BASELINE])
        ]
        own = [run['own'] + e for run, e in zip(runs[name], extra)]
        shares = [o / b for o, b in zip(own, base)]
        print(f'{name:42s} {statistics.median(own) * 1e3:.3f} ms '
              f'({100 * statistics.median(shares):.2f}%' +
              (f'; of which the extra names\' publication '
               f'{statistics.median(extra) * 1e3:+.3f} ms)' if name in
               ADDS_NAMES else ')'))


def report(runs: Dict[str, List[Dict[str, List[float]]]], clock: str,
           warmup: int) -> None:
    """Print the table of one clock."""
    print(f'{"setup":42s} {"ms/iter":>8s} {"whole run":>10s} '
          f'{"per position":>13s}')
    for name in SETUPS:
        ratios, positional = [], []
        mine = [run[clock][warmup:] for run in runs[name]]
        bases = [run[clock][warmup:] for run in runs[BASELINE]]
        for times, base in zip(mine, bases):
            ratios.append(sum(times) / sum(base))
            by_pos = [
                statistics.median(times[pos::INTERVAL]) -
                statistics.median(base[pos::INTERVAL])
                for pos in range(INTERVAL)
            ]
            positional.append(
                sum(by_pos) / (INTERVAL * statistics.median(base)))
        ms = statistics.median(t for times in mine for t in times) * 1e3
        print(f'{name:42s} {ms:8.3f} '
              f'{100 * (statistics.median(ratios) - 1):+9.2f}% '
              f'{100 * statistics.median(positional):+12.2f}%')


if __name__ == '__main__':
    main()
