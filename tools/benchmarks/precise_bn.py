"""Benchmark of mmstats.precise_bn and mmstats.dist.scaled_all_reduce.

Prints, measured side by side in this one run (CPU, ``--threads`` torch
threads, 1 by default: stable ratios on a shared machine):

1. for K = 24 and K = 128 batches (``--batches``), the overhead ratio
   ``time(update_bn_stats over K batches) / time(the
   same K forwards alone)`` (same model, ``no_grad``, train mode) for
   mmstats, fvcore's ``update_bn_stats`` and mmpretrain's ``update_bn_stats``
   (if installed), on (a) a 24 x [Linear(256, 256), BatchNorm1d, ReLU] MLP,
   batch 64 and (b) a small conv net (4 x [Conv2d, BatchNorm2d, ReLU] on
   3x32x32), batch 32. Every repeat times the forwards alone right before
   each method (interleaved), the ratio is the median over repeats;
2. PreciseBNHook's cost per run with its own loader over a dataset with
   per-sample work, ``num_workers`` 0 and 2 (persistent workers), first run
   (worker start-up) and the median of the later runs;
3. the time of ``scaled_all_reduce`` on ResNet-50's 106 BN buffers (53 BN
   layers x running_mean, running_var) over 2 gloo processes, against one
   ``all_reduce`` of a ready flat buffer of the same size, the same flat
   all_reduce with a hand-written ``cat`` + copy-back around it (the least
   work any flatten scheme does), and a per-tensor ``all_reduce`` loop.

Usage::

    python tools/benchmarks/precise_bn.py [--batches K [K ...]] [--repeats R]
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from mmstats.dist import scaled_all_reduce
from mmstats.hooks import PreciseBNHook
from mmstats.precise_bn import update_bn_stats


def mlp() -> nn.Module:
    layers = []
    for _ in range(24):
        layers += [nn.Linear(256, 256), nn.BatchNorm1d(256), nn.ReLU()]
    return nn.Sequential(*layers)


def convnet() -> nn.Module:
    layers, cin = [], 3
    for cout, stride in ((16, 1), (32, 2), (32, 1), (64, 2)):
        layers += [
            nn.Conv2d(cin, cout, 3, stride, padding=1),
            nn.BatchNorm2d(cout),
            nn.ReLU()
        ]
        cin = cout
    return nn.Sequential(*layers)


def methods(batch_size: int, num_batches: int):
    """name -> callable(model, data), or name -> reason it is missing."""
    out = {
        'mmstats':
        lambda m, d: update_bn_stats(
            m, d, num_samples=batch_size * num_batches, progress=False),
    }
    try:
        from fvcore.nn.precise_bn import update_bn_stats as fv_update
        out['fvcore'] = lambda m, d: fv_update(m, d, num_iters=num_batches)
    except ImportError:
        out['fvcore'] = 'not installed'
    try:
        from mmpretrain.engine.hooks.precise_bn_hook import \
            update_bn_stats as mmpretrain_update

        class _Loader(list):
            batch_size = batch_size

        out['mmpretrain'] = lambda m, d: mmpretrain_update(
            m, _Loader(d), num_samples=batch_size * num_batches)
    except ImportError:
        out['mmpretrain'] = 'not installed'
    return out


def bench_overhead(name, model, data, repeats):
    model.train()
    batch_size = data[0].shape[0]
    todo = methods(batch_size, len(data))

    @torch.no_grad()
    def forwards():
        for x in data:
            model(x)

    def timed(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    runnable = {k: v for k, v in todo.items() if callable(v)}
    for fn in runnable.values():  # warm-up
        fn(model, data)
    forwards()
    ratios = {k: [] for k in runnable}
    fwd_times = []
    for _ in range(repeats):
        for key, fn in runnable.items():
            base = timed(forwards)
            took = timed(lambda: fn(model, data))
            base2 = timed(forwards)
            fwd_times += [base, base2]
            ratios[key].append(took / (0.5 * (base + base2)))
    print(f'\n[{name}] {len(data)} batches of {batch_size}; forwards alone: '
          f'{statistics.median(fwd_times) * 1e3:.1f} ms (median)')
    print(f'  {"method":<12} {"ratio (median)":>15} {"min":>7} {"max":>7}')
    for key, val in todo.items():
        if callable(val):
            r = ratios[key]
            print(f'  {key:<12} {statistics.median(r):>15.3f} '
                  f'{min(r):>7.3f} {max(r):>7.3f}')
        else:
            print(f'  {key:<12} {val:>15}')


# -- PreciseBNHook per run, with its own loader ------------------------------
class SlowDataset(torch.utils.data.Dataset):
    """3x32x32 images with some per-sample work (a decoding stand-in)."""

    def __init__(self, size: int = 2048, work: int = 100) -> None:
        self.size, self.work = size, work

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(idx)
        img = torch.rand(3, 32, 32, generator=gen)
        for _ in range(self.work):
            img = (img * 1.0001).clamp_(0, 1)
        return img


def bench_hook(runs: int = 6, num_samples: int = 512) -> None:
    """Seconds per run; 'restarting' rebuilds the loader without persistent
    workers (what every run paid before the hook kept its workers)."""
    import logging
    from unittest.mock import MagicMock

    from mmengine.logging import MMLogger
    from mmengine.runner import EpochBasedTrainLoop
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    print(f'\n[PreciseBNHook] convnet, {num_samples} samples per run, '
          'batch 32, dataset with per-sample work; seconds per run')
    print(f'  {"num_workers":<22} {"first run":>10} {"later (median)":>15}')
    for workers, persistent in ((0, False), (2, True), (2, False)):
        runner = MagicMock()
        runner.model = convnet().train()
        runner.seed, runner.hooks, runner.epoch = 0, [], 0
        runner.train_loop = MagicMock(spec=EpochBasedTrainLoop)
        runner.train_dataloader = torch.utils.data.DataLoader(
            SlowDataset(), batch_size=32, num_workers=workers)
        restarting = None  # the hook's own loader: workers kept
        if workers and not persistent:
            restarting = dict(
                batch_size=32,
                num_workers=workers,
                persistent_workers=False,
                dataset=runner.train_dataloader.dataset,
                sampler=dict(type='DefaultSampler', shuffle=True),
                collate_fn=dict(type='default_collate'))
        hook = PreciseBNHook(
            num_samples=num_samples, dataloader=restarting, progress=False)
        hook.before_run(runner)
        hook.before_train(runner)
        times = []
        for _ in range(runs):  # every epoch ends with a recomputation
            start = time.perf_counter()
            hook.after_train_epoch(runner)
            times.append(time.perf_counter() - start)
        label = f'{workers}' + (' (persistent)' if persistent else
                                ' (restarting)' if workers else '')
        print(f'  {label:<22} {times[0]:>10.3f} '
              f'{statistics.median(times[1:]):>15.3f}')
        del hook  # persistent workers end with their loader


# -- scaled_all_reduce over 2 gloo processes -------------------------------
def resnet50_bn_channels():
    chans = [64]  # stem
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            chans += [planes, planes, planes * 4]
            if b == 0:
                chans.append(planes * 4)  # downsample BN
    assert len(chans) == 53, len(chans)
    return chans


def _dist_worker(rank, world_size, port, repeats, queue):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    try:
        tensors = [
            torch.randn(c) for c in resnet50_bn_channels() for _ in range(2)
        ]
        flat = torch.cat(tensors)

        def ours():
            scaled_all_reduce(tensors)

        def one_flat():
            dist.all_reduce(flat)
            flat.div_(world_size)

        sizes = [t.numel() for t in tensors]

        def manual():  # the minimum work of any flatten/copy-back scheme
            buf = torch.cat(tensors)
            dist.all_reduce(buf)
            buf.div_(world_size)
            torch.split_with_sizes_copy(buf, sizes, out=tensors)

        def loop():
            for t in tensors:
                dist.all_reduce(t)
            for t in tensors:
                t.div_(world_size)

        fns = dict(
            scaled_all_reduce=ours,
            flat=one_flat,
            manual_cat_copy_back=manual,
            per_tensor=loop)
        times = {k: [] for k in fns}
        for rep in range(repeats + 3):
            for key, fn in fns.items():
                dist.barrier()
                start = time.perf_counter()
                fn()
                took = time.perf_counter() - start
                if rep >= 3:
                    times[key].append(took)
        queue.put((rank, {
            k: statistics.median(v)
            for k, v in times.items()
        }, len(tensors), flat.numel()))
    finally:
        dist.destroy_process_group()


def bench_all_reduce(repeats):
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_dist_worker, args=(r, 2, port, repeats, queue))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=300)[:2] for _ in range(2))
    for p in procs:
        p.join()
    rank0 = results[0]
    _, _, ntensors, numel = 0, 0, 106, sum(resnet50_bn_channels()) * 2
    print(f'\n[all_reduce] ResNet-50 BN buffers: {ntensors} tensors, {numel} '
          'float32 values, 2 gloo processes (rank 0, median of '
          f'{repeats})')
    print(f'  {"method":<20} {"us":>9} {"x flat":>8}')
    for key, val in rank0.items():
        print(f'  {key:<20} {val * 1e6:>9.1f} {val / rank0["flat"]:>8.2f}')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batches', type=int, nargs='+', default=[24, 128])
    parser.add_argument('--repeats', type=int, default=15)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--only', choices=['overhead', 'hook', 'all_reduce'])
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.batches, args.repeats = [2], 1
    torch.set_num_threads(args.threads)
    print(f'torch {torch.__version__}, threads: {torch.get_num_threads()}')
    torch.manual_seed(0)
    if args.only in (None, 'overhead'):
        bench_overheads(args)
    if args.only in (None, 'hook'):
        bench_hook(*((2, 64) if args.smoke else ()))
    if args.only in (None, 'all_reduce'):
        bench_all_reduce(4 if args.smoke else max(args.repeats, 50) * 4)


def bench_overheads(args):
    for num_batches in args.batches:
        bench_overhead('24 x [Linear(256), BN1d, ReLU] MLP', mlp(),
                       [torch.randn(64, 256) for _ in range(num_batches)],
                       args.repeats)
    for num_batches in args.batches:
        bench_overhead('4 x [Conv2d, BN2d, ReLU] on 3x32x32', convnet(), [
            torch.randn(32, 3, 32, 32) for _ in range(num_batches)
        ], args.repeats)


if __name__ == '__main__':
    main()
