"""What ThroughputHook costs the digits demo (issue 28 item 6: <= 1%).

Trains ``make demo``'s config (``projects/digits_demo``: ResNet-mini,
batch 64, PreciseBNHook and StatsCollectorHook on, LoggerHook interval 10)
for ``--epochs`` epochs, without and with ``mmstats.ThroughputHook`` at its
defaults, the two setups alternating in every repeat (interleaved, so
drifts of a shared machine hit both alike). Prints side by side the
medians over repeats of:

1. ``runner.train()``'s CPU time (this thread's ``time.thread_time``: what
   the run computed, less exposed than wall time to other processes on a
   shared machine) and its wall time, with the ratio with / without the
   hook paired per repeat (and the range of the repeats' ratios: the noise
   of the machine; on a shared one it exceeds the hook's cost);
2. the hook's own share: the CPU time spent in ThroughputHook's methods
   over the run's training iterations (``thread_time``), per iteration and
   as a fraction of the run's iteration time without the hook;
3. the counted iteration (FLOPs, once per run): its time against the
   median iteration of the same run (IterTimerHook's times).

Usage: ``python tools/benchmarks/health_throughput.py [--epochs 3]
[--repeats 7]`` (needs ``pip install -e projects/digits_demo``).
"""
import argparse
import statistics
import tempfile
import time
from typing import Dict, Optional

import torch
from mmengine.config import Config
from mmengine.runner import Runner
from mmengine.utils import ManagerMixin

import mmstats  # noqa: F401  (registers the hooks)
from mmstats.hooks import ThroughputHook
from mmstats.hooks.throughput_hook import COUNTED_ITERATION

DEMO_CONFIG = ('projects/digits_demo/configs/demo/'
               'resnet-mini_1xb64-precise-bn-stats_digits.py')
SETUPS = {
    'defaults': dict(type='mmstats.ThroughputHook'),
    'no-flops': dict(type='mmstats.ThroughputHook', count_flops=False),
    'aa': None,
}
HOOK_METHODS = ('before_train_epoch', 'after_train_epoch', 'before_train_iter',
                'after_train_iter', 'before_val', 'after_val', 'after_train')


def _timed(hook: ThroughputHook, spent: list) -> None:
    """Add the CPU time of every call of the hook's methods to spent[0]."""
    for name in HOOK_METHODS:
        method = getattr(hook, name)

        def timed(*args, _method=method, **kwargs):
            start = time.thread_time()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[0] += time.thread_time() - start

        setattr(hook, name, timed)


def train(epochs: int, hook: Optional[dict]) -> Dict[str, float]:
    """One run of the demo (with ``hook`` added); its times in seconds."""
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.train_cfg.max_epochs = epochs
    cfg.default_hooks.checkpoint = None
    if hook is not None:
        cfg.custom_hooks = list(cfg.custom_hooks) + [hook]
    cfg.work_dir = tempfile.mkdtemp()
    cfg.experiment_name = f'bench_{time.time_ns()}'
    cfg.log_level = 'WARNING'
    runner = Runner.from_cfg(cfg)
    spent = [0.0]
    for each in runner.hooks:
        if isinstance(each, ThroughputHook):
            _timed(each, spent)
    wall, cpu = time.perf_counter(), time.thread_time()
    runner.train()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    times = list(runner.message_hub.get_scalar('train/time').data[0])
    for cls in ManagerMixin.__subclasses__():
        cls._instance_dict.clear()
    counted = times[COUNTED_ITERATION - 1] if hook else 0.0
    return dict(
        wall=wall,
        cpu=cpu,
        loop=sum(times),
        iters=len(times),
        hook=spent[0],
        counted_extra=counted - statistics.median(times) if hook else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument(
        '--setup',
        choices=sorted(SETUPS),
        default='defaults',
        help='what "with" trains: the hook at its defaults, the hook with '
        'count_flops=False, or no hook (an A/A run: the noise floor of this '
        'method on this machine)')
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.epochs, args.repeats = 1, 1
    torch.set_num_threads(1)
    train(1, None)  # warm-up: imports, the dataset's first load
    runs = {False: [], True: []}
    for repeat in range(args.repeats):  # interleaved, the order alternating
        for hooked in ((False, True) if repeat % 2 == 0 else (True, False)):
            runs[hooked].append(
                train(args.epochs, SETUPS[args.setup] if hooked else None))
    plain, hooked = runs[False], runs[True]
    device = 'cuda' if torch.cuda.is_available() else 'cpu, 1 thread'
    iters = hooked[0]['iters']
    print(f'## {args.setup}: {SETUPS[args.setup]} on the digits demo '
          f'({DEMO_CONFIG}), '
          f'{args.epochs} epochs ({iters} iterations), {device}, median of '
          f'{args.repeats} interleaved repeats')
    print(f'{"":46s} {"without":>9s} {"with":>9s} {"with/without":>13s}')
    for key, label in (('cpu', 'runner.train() CPU time (s)'),
                       ('wall', 'runner.train() wall time (s)'),
                       ('loop', 'training iterations, wall (s)')):
        ratios = sorted(h[key] / p[key] for h, p in zip(hooked, plain))
        ratio = statistics.median(ratios)
        print(
            f'{label:46s} {statistics.median(r[key] for r in plain):9.3f} '
            f'{statistics.median(r[key] for r in hooked):9.3f} '
            f'{100 * (ratio - 1):+12.2f}%   (repeats: '
            f'{100 * (ratios[0] - 1):+.1f}% .. {100 * (ratios[-1] - 1):+.1f}%)'
        )
    hook_s = statistics.median(r['hook'] for r in hooked)
    loop_s = statistics.median(r['loop'] for r in plain)
    extra = statistics.median(r['counted_extra'] for r in hooked)
    print(f'{"the hook own CPU time per iteration (us)":46s} '
          f'{1e6 * hook_s / iters:9.1f}')
    print(f'{"the hook own CPU time / iteration time":46s} '
          f'{100 * hook_s / loop_s:8.3f}%')
    print(f'{"counted iteration: extra time, once (ms)":46s} '
          f'{1e3 * extra:9.1f}   ({100 * extra / loop_s:.3f}% of this run)')


if __name__ == '__main__':
    main()
