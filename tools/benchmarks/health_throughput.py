"""What ThroughputHook costs the digits demo (issue 28 item 6: <= 1%).

Trains ``make demo``'s config (``projects/digits_demo``: ResNet-mini,
batch 64, PreciseBNHook and StatsCollectorHook on, LoggerHook interval 10)
for ``--epochs`` epochs, without and with ``mmstats.ThroughputHook`` at its
defaults (FLOPs counted on the first iteration), the two setups alternating
in every repeat (interleaved, so drifts of a shared machine hit both alike).
Prints side by side the medians over repeats of:

1. the training loop's time (the sum of IterTimerHook's iteration times:
   every hook's per-iteration work, the publications and the counted first
   iteration; validation and precise BN are not in it), and the ratio with
   / without the hook, paired per repeat;
2. the same without the first iteration (the FLOPs are counted there, once
   per run: its extra cost shrinks with longer runs);
3. the whole ``runner.train()`` wall time and its ratio.

Usage: ``python tools/benchmarks/health_throughput.py [--epochs 2]
[--repeats 5]`` (needs ``pip install -e projects/digits_demo``).
"""
import argparse
import statistics
import tempfile
import time
from typing import Dict

import torch
from mmengine.config import Config
from mmengine.runner import Runner
from mmengine.utils import ManagerMixin

import mmstats  # noqa: F401  (registers the hooks)

DEMO_CONFIG = ('projects/digits_demo/configs/demo/'
               'resnet-mini_1xb64-precise-bn-stats_digits.py')


def train(epochs: int, hooked: bool) -> Dict[str, float]:
    """One run of the demo; its times in seconds."""
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.train_cfg.max_epochs = epochs
    cfg.default_hooks.checkpoint = None
    if hooked:
        cfg.custom_hooks = list(
            cfg.custom_hooks) + [dict(type='mmstats.ThroughputHook')]
    cfg.work_dir = tempfile.mkdtemp()
    cfg.experiment_name = f'bench_{time.time_ns()}'
    cfg.log_level = 'WARNING'
    runner = Runner.from_cfg(cfg)
    start = time.perf_counter()
    runner.train()
    wall = time.perf_counter() - start
    times = list(runner.message_hub.get_scalar('train/time').data[0])
    for cls in ManagerMixin.__subclasses__():
        cls._instance_dict.clear()
    return dict(loop=sum(times), after_first=sum(times[1:]), wall=wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train(1, False)  # warm-up: imports, the dataset's first load
    runs = {False: [], True: []}
    for repeat in range(args.repeats):  # interleaved, the order alternating
        for hooked in ((False, True) if repeat % 2 == 0 else (True, False)):
            runs[hooked].append(train(args.epochs, hooked))
    device = 'cuda' if torch.cuda.is_available() else 'cpu, 1 thread'
    print(f'## ThroughputHook on the digits demo ({DEMO_CONFIG}), '
          f'{args.epochs} epochs, {device}, median of {args.repeats} '
          'interleaved repeats')
    print(f'{"":44s} {"without":>9s} {"with":>9s} {"with/without":>13s}')
    for key, label in (('loop', 'training iterations (s)'),
                       ('after_first', 'iterations after the first (s)'),
                       ('wall', 'runner.train() wall time (s)')):
        plain = [run[key] for run in runs[False]]
        hooked = [run[key] for run in runs[True]]
        ratio = statistics.median(h / p for h, p in zip(hooked, plain))
        print(f'{label:44s} {statistics.median(plain):9.3f} '
              f'{statistics.median(hooked):9.3f} {100 * (ratio - 1):+12.2f}%')


if __name__ == '__main__':
    main()
