"""Benchmark of mmstats.update_bn_stats on a sharded model (FSDP1, FSDP2).

Spawns 2 gloo processes (CPU, 1 torch/OMP thread each) that shard a small
ResNet-like net (a strided stem, then 3 ``Block`` = [Conv-BN-ReLU-Conv-BN
+ skip, ReLU], 16 then 32 channels, 3x32x32 inputs, batch 32; ~10 ms a
forward on one thread) with

- FSDP1: ``FullyShardedDataParallel(use_orig_params=True)``, one unit per
  ``Block`` (``ModuleWrapPolicy``) and the root;
- FSDP2: ``fully_shard`` on each ``Block``, then on the root.

Per strategy, each round times, in turn (interleaved: A B A B ...):

1. ``forwards``: the same K forwards (``--batches``, per rank) of the
   same sharded model under ``no_grad`` with its BN layers in train mode
   and no statistics recorder, then ``mmstats.sharding.reshard`` (which
   ``update_bn_stats`` also calls at its end: FSDP2 keeps the root's
   gathered parameters after a forward);
2. ``update_bn_stats``: ``update_bn_stats(model, batches, num_samples=2 x
   K x 32, progress=False)`` over the same fixed K batches per rank.

Both ranks run the same work, after a barrier; rank 0's times are shown,
the medians over rounds (after one warm-up round) and their ratio, and
the ratio computed per round then its median (``ratio/round``; the one
to read on a shared, noisy machine). A ratio of 1.00 means that
``update_bn_stats`` costs nothing beyond the forwards it runs; the goal
is at most 1.05. Both ranks must have run exactly K forwards in each
timed part (asserted).

How ``update_bn_stats`` runs on a sharded model: it forwards through the
sharding wrapper (the FSDP1 root wrapper / the FSDP2 root module), so
each FSDP unit gathers its own shards for its forward and frees them after
(the root's may stay gathered between forwards, as in training); the
whole model is never gathered. As every forward is then a collective,
the ranks agree before each batch, with one MIN ``all_reduce`` of 4 flags
(have a batch, preparing it went fine, still want samples, batch of >= 2
samples), whether to forward it on every rank or to stop on every rank,
so ranks never diverge in the number of forwards. That agreement (K + 1
small all_reduces: the last one agrees to stop), the BN statistics
recorder and the final reduction of the statistics are part of the cost
measured here.

Usage::

    python tools/benchmarks/precise_bn_sharded.py [--quick] [--rounds R]
        [--batches K]
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

from mmstats import update_bn_stats
from mmstats.sharding import reshard

WORLD_SIZE = 2
BATCH_SIZE = 32


def conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, padding=1, bias=False),
        nn.BatchNorm2d(cout))


class Block(nn.Module):
    """Conv-BN-ReLU-Conv-BN plus a skip (strided 1x1 Conv-BN if needed),
    then ReLU: the FSDP unit."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = conv_bn(cin, cout, stride)
        self.conv2 = conv_bn(cout, cout)
        self.skip = nn.Identity() if cin == cout and stride == 1 else \
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(torch.relu(self.conv1(x)))
        return torch.relu(out + self.skip(x))


class Net(nn.Module):
    """Strided stem (3 -> 16, to 16x16), a Block of 16 at 16x16, 2 Blocks
    of 32 at 8x8, pooled linear head; counts its forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 16, 2), nn.ReLU())
        self.blocks = nn.Sequential(
            Block(16, 16), Block(16, 32, 2), Block(32, 32))
        self.head = nn.Linear(32, 10)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        x = self.blocks(self.stem(x))
        return self.head(x.mean((2, 3)))


def shard(net: Net, strategy: str) -> nn.Module:
    if strategy == 'FSDP1':
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        return FullyShardedDataParallel(
            net,
            device_id=torch.device('cpu'),
            use_orig_params=True,
            auto_wrap_policy=ModuleWrapPolicy({Block}))
    from torch.distributed.fsdp import fully_shard
    for block in net.blocks:
        fully_shard(block)
    fully_shard(net)
    return net


def _worker(rank, port, strategies, rounds, num_batches, queue):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=WORLD_SIZE)
    try:
        gen = torch.Generator().manual_seed(rank)
        batches = [
            torch.randn(BATCH_SIZE, 3, 32, 32, generator=gen)
            for _ in range(num_batches)
        ]
        num_samples = WORLD_SIZE * num_batches * BATCH_SIZE
        models, nets = {}, {}
        for strategy in strategies:
            torch.manual_seed(0)  # the same weights on every rank
            nets[strategy] = Net()
            models[strategy] = shard(nets[strategy], strategy).train()

        def forwards(model):
            with torch.no_grad():
                for x in batches:
                    model(x)
            reshard(model)

        def precise_bn(model):
            summary = update_bn_stats(
                model, batches, num_samples=num_samples, progress=False)
            assert summary['num_batches'] == WORLD_SIZE * num_batches, summary

        fns = {'forwards': forwards, 'update_bn_stats': precise_bn}
        times = {(s, k): [] for s in strategies for k in fns}
        calls = {(s, k): [] for s in strategies for k in fns}
        for rnd in range(rounds + 1):  # round 0: warm-up
            for strategy in strategies:
                for key, fn in fns.items():
                    net = nets[strategy]
                    before = net.calls
                    dist.barrier()  # rank skew is not the method's cost
                    start = time.perf_counter()
                    fn(models[strategy])
                    took = time.perf_counter() - start
                    calls[strategy, key].append(net.calls - before)
                    if rnd:
                        times[strategy, key].append(took)
        queue.put((rank, times, calls))
    finally:
        dist.destroy_process_group()


def run(strategies, rounds, num_batches):
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context('spawn')
    queue = ctx.SimpleQueue()
    procs = mp.spawn(
        _worker,
        args=(port, strategies, rounds, num_batches, queue),
        nprocs=WORLD_SIZE,
        join=False)
    results = {}
    while len(results) < WORLD_SIZE:
        if not queue.empty():
            rank, times, calls = queue.get()
            results[rank] = times, calls
        elif procs.join(timeout=0.1):  # all ended (raises if one failed)
            break
    while not procs.join():
        pass
    assert len(results) == WORLD_SIZE, 'a rank returned nothing'
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--rounds', type=int, help='timed rounds (default 11, --quick 3)')
    parser.add_argument(
        '--batches', type=int, default=16, help='K batches per rank')
    parser.add_argument(
        '--quick', action='store_true', help='3 rounds (a smoke run)')
    parser.add_argument(
        '--strategies',
        nargs='+',
        default=['FSDP1', 'FSDP2'],
        choices=['FSDP1', 'FSDP2'])
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.batches = 1, 2
    rounds = args.rounds or (3 if args.quick else 11)
    os.environ['OMP_NUM_THREADS'] = '1'  # inherited by the ranks
    results = run(args.strategies, rounds, args.batches)
    # every rank ran exactly K forwards in every timed part, warm-up too
    for (key, counts0), counts1 in zip(results[0][1].items(),
                                       results[1][1].values()):
        assert counts0 == counts1 == [args.batches] * (rounds + 1), \
            (key, counts0, counts1)
    times = results[0][0]
    print(f'torch {torch.__version__}, {WORLD_SIZE} gloo ranks x 1 thread, '
          f'{args.batches} batches of {BATCH_SIZE} x 3x32x32 per rank; '
          f'rank 0, medians of {rounds} interleaved rounds')
    header = (f'{"strategy":<8} | {"forwards ms":>11} | '
              f'{"update_bn_stats ms":>18} | {"ratio":>5} | '
              f'{"ratio/round":>11} | {"min":>5} | {"max":>5}')
    print(header)
    print('-' * len(header))
    median = statistics.median
    for strategy in args.strategies:
        base = times[strategy, 'forwards']
        ours = times[strategy, 'update_bn_stats']
        per_round = [a / b for a, b in zip(ours, base)]
        print(f'{strategy:<8} | {median(base) * 1e3:>11.1f} | '
              f'{median(ours) * 1e3:>18.1f} | '
              f'{median(ours) / median(base):>5.3f} | '
              f'{median(per_round):>11.3f} | {min(per_round):>5.3f} | '
              f'{max(per_round):>5.3f}')


if __name__ == '__main__':
    main()
