"""What the hang watch costs (issue 55 item 6; ``docs/hangs.md``).

1. **Per iteration, on the digits demo** (``make demo``'s config, one
   process): trains ``--epochs`` epochs with ``mmstats.HangWatchHook`` at
   its defaults, counts the phase changes per training iteration and
   measures the host work they add: ``Progress.enter`` (timeit), the
   replaced ``call_hook`` against mmengine's own over the demo's hooks
   (timeit, the hooks' own work left out: each hook method is a no-op
   there) and the model's forward pre/post hooks; the sum against the
   demo's median iteration time (IterTimerHook). The goal: below 0.2 %.
2. **Store traffic per rank per minute** at 2, 4 and 8 ranks: real gloo
   process groups (the default store, a ``TCPStore``), every rank's
   watchdog running ``--seconds`` with ``interval`` 0.25 s over a progress
   its main thread changes every 5 ms, the store wrapped to count the
   calls and bytes of each rank; scaled to the default interval (5 s) per
   minute, and written for 1,000 ranks by the same arithmetic.

Usage: ``python tools/benchmarks/hangs.py [--epochs 1] [--seconds 4]``
(needs ``pip install -e projects/digits_demo``).
"""
import argparse
import os
import statistics
import tempfile
import threading
import time
import timeit
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEMO_CONFIG = ('projects/digits_demo/configs/demo/'
               'resnet-mini_1xb64-precise-bn-stats_digits.py')
DEFAULT_INTERVAL = 5.


def _demo(epochs: int) -> Dict[str, float]:
    """Train the demo with the watch; the phase changes per iteration,
    the median iteration time and the per-call costs."""
    from mmengine.config import Config
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    import mmstats  # noqa: F401  (the registry)
    from mmstats.health import Progress
    from mmstats.hooks import HangWatchHook

    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.work_dir = tempfile.mkdtemp(prefix='hangs_bench_')
    cfg.train_cfg.max_epochs = epochs
    cfg.custom_hooks = list(
        cfg.custom_hooks) + [dict(type='mmstats.HangWatchHook')]
    runner = Runner.from_cfg(cfg)
    watch = [h for h in runner.hooks if isinstance(h, HangWatchHook)][0]
    counts = [0]
    enter = Progress.enter

    def counted(self, *args, **kwargs):
        counts[0] += 1
        return enter(self, *args, **kwargs)

    Progress.enter = counted
    try:
        runner.train()
    finally:
        Progress.enter = enter
    iterations = runner.iter
    times = runner.message_hub.get_scalar('train/time').data[0]
    iteration = statistics.median(times[1:])  # the first compiles
    progress = Progress()
    per_enter = min(
        timeit.repeat(
            lambda: progress.enter('hook', 'X.after_train_iter'),
            number=10000,
            repeat=5)) / 10000

    class Bare(Hook):
        pass

    hooks = [Bare() for _ in runner.hooks]
    fake = type('R', (), {})()
    fake._hooks = hooks
    fake.iter = 0
    watch._runner, watch.progress, watch._plans = fake, Progress(), {}
    watch._planned_for = 0
    fns = ('before_train_iter', 'after_train_iter')

    def theirs():
        for fn in fns:
            for hook in hooks:
                if hasattr(hook, fn):
                    getattr(hook, fn)(fake, batch_idx=0)

    def ours():
        for fn in fns:
            watch._call_hook(fn, batch_idx=0)

    base = min(timeit.repeat(theirs, number=2000, repeat=5)) / 2000
    replaced = min(timeit.repeat(ours, number=2000, repeat=5)) / 2000
    return dict(
        iterations=iterations,
        enters=counts[0] / iterations,
        iteration=iteration,
        per_enter=per_enter,
        call_hook_extra=replaced - base,
        hooks=len(hooks))


class _Counting:
    """A store proxy counting each call and the bytes it moves."""

    def __init__(self, store) -> None:
        self.store, self.calls, self.bytes = store, {}, 0
        self.lock = threading.Lock()

    def _count(self, name: str, size: int) -> None:
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.bytes += size

    def set(self, key, value):
        self._count('set', len(key) + len(value))
        return self.store.set(key, value)

    def get(self, key):
        value = self.store.get(key)
        self._count('get', len(key) + len(value))
        return value

    def multi_get(self, keys):
        values = self.store.multi_get(keys)
        self._count('multi_get', sum(map(len, keys)) + sum(map(len, values)))
        return values

    def check(self, keys):
        self._count('check', sum(map(len, keys)))
        return self.store.check(keys)

    def add(self, key, value):
        self._count('add', len(key))
        return self.store.add(key, value)


def _rank(rank: int, world_size: int, port: int, seconds: float,
          interval: float, out) -> None:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    from mmstats.health import HangConfig, HangWatchdog, Progress
    from mmstats.health.hang_watchdog import build_channel
    channel = build_channel(world_size)
    channel.store = _Counting(channel.store)
    progress = Progress()
    watch = HangWatchdog(
        HangConfig(timeout=600, interval=interval), progress, channel, rank,
        world_size, tempfile.gettempdir())
    watch.start()
    end, it = time.time() + seconds, 0
    while time.time() < end:
        progress.enter('forward' if it % 2 else 'data', iteration=it // 2)
        it += 1
        time.sleep(0.005)
    watch.stop()
    looks = seconds / interval
    out.put((rank, {
        k: v / looks
        for k, v in channel.store.calls.items()
    }, channel.store.bytes / looks))
    dist.barrier()
    dist.destroy_process_group()


def _traffic(world_size: int, seconds: float, interval: float) -> List:
    from tests.helpers.dist import free_port
    ctx = mp.get_context('spawn')
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank, args=(r, world_size, port, seconds, interval, out))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--epochs', type=int, default=1)
    parser.add_argument('--seconds', type=float, default=4.)
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes (2 and 4 ranks, half a second each): the suite '
        'checks the script runs, not its figures')
    args = parser.parse_args()
    if args.smoke:
        args.seconds = 0.5
    torch.set_num_threads(1)

    demo = _demo(args.epochs)
    extra = (demo['enters'] * demo['per_enter'] + demo['call_hook_extra'] +
             2 * 0.3e-6)  # forward pre/post hooks: a tuple read each
    print(f"demo: {demo['iterations']} iterations, median "
          f"{demo['iteration'] * 1e3:.1f} ms; {demo['enters']:.1f} phase "
          f"changes per iteration x {demo['per_enter'] * 1e6:.2f} us; "
          f"call_hook replaced: +{demo['call_hook_extra'] * 1e6:.1f} us per "
          f"iteration over {demo['hooks']} hooks; in all "
          f"{extra * 1e6:.1f} us = {100 * extra / demo['iteration']:.3f} % "
          'of an iteration (goal < 0.2 %)')

    interval = 0.25
    per_minute = 60 / DEFAULT_INTERVAL
    rank0 = []
    for world_size in (2, 4) if args.smoke else (2, 4, 8):
        results = _traffic(world_size, args.seconds, interval)
        rank0.append((world_size, results[0][2]))  # bytes per look
        for rank, calls, size in (results[0], results[-1]):
            ops = sum(calls.values())
            kinds = ', '.join(f'{k} {v:.2f}' for k, v in sorted(calls.items()))
            print(f'{world_size} ranks, rank {rank}: {ops:.2f} store calls '
                  f'per look ({kinds}), {size:.0f} B per look; at interval '
                  f'5 s: {ops * per_minute:.0f} calls, '
                  f'{size * per_minute / 1024:.1f} KiB per minute')
    # rank 0's bytes grow by one record per rank; the others' stay
    (small, low), (large, high) = rank0[0], rank0[-1]
    per_rank = (high - low) / (large - small)
    at_1000 = low + (1000 - small) * per_rank
    print(f'1,000 ranks by the same arithmetic: rank 0 reads '
          f'{per_rank:.0f} B more per rank and look: {at_1000 / 1024:.0f} '
          f'KiB per look, {at_1000 * per_minute / 2**20:.2f} MiB per '
          f'minute in {per_minute:.0f} multi_gets; every other rank as at 8 '
          f'ranks; the store ~{1000 * 2 * per_minute:.0f} calls per minute')


if __name__ == '__main__':
    main()
