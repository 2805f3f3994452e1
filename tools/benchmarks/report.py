"""Benchmark of mmstats.stats: report() cost and Collector.update() time.

Prints, measured in this one run (CPU, ``torch.set_num_threads(1)``):

1. per ``report()`` call, beside StyleGAN3's ``training_stats.report`` in
   the same run, for a 0-d tensor and 1,024 / 65,536 / 1,048,576 elements,
   float32 and float16: the ATen operations it issues (counted with a
   ``TorchDispatchMode``: exact, the same on every device) and the
   microseconds per call (median over interleaved repeats, a Collector
   alive and ``update()`` between repeats, outside the timed region) with
   the ratio to StyleGAN3's (median of the per-repeat ratios); then
   ``report(float)``, torchmetrics'
   ``MeanMetric(nan_strategy='disable').update`` and mmengine's
   ``MessageHub.update_scalar`` as ratios to StyleGAN3's 0-d call;
2. time of ``Collector.update()`` for 200 names over 2 gloo processes,
   beside 200 torchmetrics ``MeanMetric.compute()`` calls (with their dist
   sync) over 2 gloo processes;
3. StatsCollectorHook overhead: the iteration-based demo trained (a) with
   no reports and no hook, (b) with the model computing and reporting its
   statistics but no hook (reports are no-ops without a Collector), (c)
   with (b) + StatsCollectorHook(interval=1); interleaved repeats, median
   time per iteration from IterTimerHook, torch's default thread count.
   The hook's overhead is (c) / (b) - 1.

Usage: ``python tools/benchmarks/report.py [--calls N] [--repeats R]
[--only report|compile|update|hook]``
"""
import argparse
import importlib.util
import os
import socket
import statistics
import sys
import time
from typing import List, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.fx.node import has_side_effect

from mmstats.stats import Collector, report

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stylegan3_ref  # noqa: E402

count_aten_ops = stylegan3_ref.count_aten_ops
stylegan3_report = stylegan3_ref.stylegan3_report
stylegan3_reset = stylegan3_ref.stylegan3_reset


def per_call_us(fn, value, calls, repeats, between=None):
    """Median over ``repeats`` of the mean time per call of ``fn(value)``."""
    times = []
    for _ in range(repeats + 1):  # the first repeat is a warm-up
        start = time.perf_counter()
        for _ in range(calls):
            fn(value)
        times.append((time.perf_counter() - start) / calls * 1e6)
        if between is not None:
            between()
    return statistics.median(times[1:])


SIZES = (0, 1024, 65536, 1048576)  # 0: a 0-d tensor


def bench_report(calls, repeats):
    """report() beside StyleGAN3's report, per size and dtype: ATen ops per
    call (exact) and microseconds per call with their ratio (one run)."""
    from mmengine.logging import MessageHub
    torch.set_num_threads(1)
    collector = Collector()
    print(f'## report() per call beside StyleGAN3 training_stats.report '
          f'(1 thread, median of {repeats} repeats)')
    print(f'{"value":24s} {"ops":>4} {"SG3 ops":>8} {"us":>9} '
          f'{"SG3 us":>9} {"ratio":>6}')
    sg3_zero_d = None
    for dtype in (torch.float32, torch.float16):
        for numel in SIZES:
            x = torch.randn(numel if numel else ()).to(dtype) + 3
            report('x', x)  # steady state for both
            stylegan3_report('x', x)
            ops = len(count_aten_ops(lambda: report('x', x)))
            sg3_ops = len(count_aten_ops(lambda: stylegan3_report('x', x)))
            n = max(calls * 1024 // max(numel, 1024), 3)
            (ours_us, sg3_us), (ratio, _) = interleaved_us(
                [lambda v: report('x', v), lambda v: stylegan3_report('x', v)],
                x,
                n,
                repeats,
                collector.update,
                ratios=True)
            if numel == 0 and dtype is torch.float32:
                sg3_zero_d = sg3_us
            label = f'{"0-d" if not numel else numel} {str(dtype)[6:]}'
            print(f'{label:24s} {ops:>4} {sg3_ops:>8} {ours_us:>9.2f} '
                  f'{sg3_us:>9.2f} {ratio:>5.2f}x')
    stylegan3_reset()
    zero_d = torch.tensor(1.5)
    hub = MessageHub.get_current_instance()
    rows = [('report(float)', lambda v: report('lr', v), 1.5)]
    metric = None
    try:
        from torchmetrics import MeanMetric
    except ImportError:
        print('(torchmetrics is not installed: its row is left out)')
    else:
        metric = MeanMetric(nan_strategy='disable')
        rows.append(
            ("torchmetrics MeanMetric(nan_strategy='disable').update(0-d)",
             metric.update, zero_d))
    rows += [
        ('mmengine MessageHub.update_scalar(0-d tensor)',
         lambda v: hub.update_scalar('train/loss', v), zero_d),
        ('mmengine MessageHub.update_scalar(float)',
         lambda v: hub.update_scalar('train/lr', v), 1.5),
    ]

    def between():
        collector.update()
        if metric is not None:
            metric.reset()

    print('## other calls, us per call (ratio to StyleGAN3 report(0-d '
          'float32) above)')
    for label, fn, value in rows:
        us = per_call_us(fn, value, calls, repeats, between)
        print(f'{label:62s} {us:8.2f}  {us / sg3_zero_d:5.2f}x')


def interleaved_us(fns, value, calls, repeats, between=None, ratios=False):
    """Medians of the time per call of each ``fn(value)``, repeats
    interleaved (drifts hit every function alike), the order turned round
    every repeat; with ``ratios``, also the median over repeats of each
    one's time over the last function's in the same repeat (robust to a
    load that comes and goes on a shared machine)."""
    times = [[] for _ in fns]
    for rep in range(repeats + 1):  # the first repeat is a warm-up
        order = list(range(len(fns)))
        if rep % 2:
            order.reverse()
        for i in order:
            start = time.perf_counter()
            for _ in range(calls):
                fns[i](value)
            if rep:
                times[i].append((time.perf_counter() - start) / calls * 1e6)
            if between is not None:
                between()
    medians = [statistics.median(t) for t in times]
    if not ratios:
        return medians
    return medians, [
        statistics.median(a / b for a, b in zip(t, times[-1])) for t in times
    ]


# --------------------------------------------------------------------------
# 2 gloo processes: Collector.update() vs torchmetrics compute()
# --------------------------------------------------------------------------
def _free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _dist_worker(rank, world, port, num_names, repeats, queue):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=world)
    names = [f'stat_{i:03d}' for i in range(num_names)]
    collector = Collector()
    ours = []
    for step in range(repeats + 2):  # the first two settle the name table
        for name in names:
            report(name, torch.tensor(float(step + rank)))
        dist.barrier()
        start = time.perf_counter()
        collector.update()
        ours.append(time.perf_counter() - start)
    if importlib.util.find_spec('torchmetrics') is None:
        queue.put((rank, statistics.median(ours[2:]) * 1e3, None))
        dist.destroy_process_group()
        return
    from torchmetrics import MeanMetric
    metrics = [MeanMetric(nan_strategy='disable') for _ in names]
    theirs = []
    for step in range(repeats + 2):
        for metric in metrics:
            metric.update(torch.tensor(float(step + rank)))
        dist.barrier()
        start = time.perf_counter()
        for metric in metrics:
            metric.compute()
        theirs.append(time.perf_counter() - start)
        for metric in metrics:
            metric.reset()
    queue.put((rank, statistics.median(ours[2:]) * 1e3,
               statistics.median(theirs[2:]) * 1e3))
    dist.destroy_process_group()


def bench_update(num_names=200, world=2, repeats=20):
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_dist_worker,
            args=(rank, world, port, num_names, repeats, queue))
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    results = sorted(queue.get(timeout=600) for _ in range(world))
    for proc in procs:
        proc.join()
    ours = max(r[1] for r in results)
    theirs = None if results[0][2] is None else max(r[2] for r in results)
    print(f'## {num_names} names over {world} gloo processes, ms '
          f'(median of {repeats}, slowest rank)')
    print(f'{"Collector.update() (3 all_reduces)":62s} {ours:8.2f}')
    label = f'{num_names} x torchmetrics MeanMetric.compute() (dist sync)'
    if theirs is None:
        print('(torchmetrics is not installed: its row is left out)')
    else:
        print(f'{label:62s} {theirs:8.2f}')


# --------------------------------------------------------------------------
# StatsCollectorHook overhead
# --------------------------------------------------------------------------
def _train_seconds_per_iter(report_stats: bool, with_hook: bool,
                            iters: int) -> Tuple[float, float]:
    """Median step time of the demo and, with the hook, the median time of
    the hook's ``after_train_iter`` in the same run."""
    import os.path as osp
    import tempfile

    from mmengine.config import Config
    from mmengine.runner import Runner
    from mmengine.utils import ManagerMixin

    from mmstats.hooks import StatsCollectorHook
    repo = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    cfg = Config.fromfile(
        osp.join(
            repo, 'projects/digits_demo/configs/demo/'
            'resnet-mini_1xb64-iter_digits.py'))
    cfg.work_dir = tempfile.mkdtemp()
    cfg.experiment_name = f'bench_{time.time_ns()}'
    cfg.train_cfg = dict(
        type='IterBasedTrainLoop', max_iters=iters, val_interval=10 * iters)
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    cfg.param_scheduler = []
    cfg.default_hooks.checkpoint = None
    cfg.log_level = 'WARNING'
    # LoggerHook logs every iteration in every setup, so the hook publishes
    # where it logs (at other iterations it writes scalars.json itself).
    cfg.default_hooks.logger.interval = 1
    cfg.model.report_stats = report_stats
    cfg.custom_hooks = [dict(type='mmstats.StatsCollectorHook', interval=1)
                        ] if with_hook else []
    runner = Runner.from_cfg(cfg)
    hook_times: List[float] = []
    for hook in runner.hooks:
        if isinstance(hook, StatsCollectorHook):
            inner = hook.after_train_iter

            def timed(*args, inner=inner, **kwargs):
                start = time.perf_counter()
                inner(*args, **kwargs)
                hook_times.append(time.perf_counter() - start)

            hook.after_train_iter = timed
    runner.train()
    # IterTimerHook's per-iteration times: no setup, robust median
    seconds = statistics.median(
        runner.message_hub.get_scalar('train/time').data[0][5:])
    for cls in ManagerMixin.__subclasses__():
        cls._instance_dict.clear()
    hook_seconds = statistics.median(hook_times[5:]) if hook_times else 0.
    return seconds, hook_seconds


def bench_hook(iters=300, repeats=5):
    """Step time of the demo with and without StatsCollectorHook."""
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    import mmstats  # noqa: F401  (registers the hook)
    setups = {
        'no reports, no hook': (False, False),
        'model computes and reports 4 statistics, no hook': (True, False),
        '... + StatsCollectorHook(interval=1)': (True, True),
    }
    runs = {key: [] for key in setups}
    own = []  # (hook time, step time) of the same run
    for _ in range(repeats):  # interleaved: drifts hit all setups alike
        for key, (report_stats, with_hook) in setups.items():
            step, hook = _train_seconds_per_iter(report_stats, with_hook,
                                                 iters)
            runs[key].append(step)
            if with_hook:
                own.append(hook / step)
    torch.set_num_threads(threads)
    ms = {key: statistics.median(v) * 1e3 for key, v in runs.items()}
    base, reports, hooked = ms.values()
    print(f'## StatsCollectorHook(interval=1) on the demo training '
          f'({iters} iterations, {os.cpu_count()} threads, median of '
          f'{repeats}); ms per iteration')
    for key, value in ms.items():
        print(f'{key:62s} {value:8.3f}')
    print(f'{"hook overhead (hook / no hook, same model)":62s} '
          f'{100 * (hooked / reports - 1):7.2f}%')
    print(f'{"hook + the model computing its statistics (vs none)":62s} '
          f'{100 * (hooked / base - 1):7.2f}%')
    print(f'{"hook after_train_iter time / step time, in the same run":62s} '
          f'{100 * statistics.median(own):7.2f}%')


# --------------------------------------------------------------------------
# torch.compile: a compiled forward with and without report() calls
# --------------------------------------------------------------------------
class _Mlp(torch.nn.Module):

    def __init__(self, width: int = 64):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, width)
        self.fc2 = torch.nn.Linear(width, 10)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


class _ReportingMlp(_Mlp):

    def forward(self, x):
        h = self.fc1(x).relu()
        report('h_mean', h.mean())
        report('h', h)
        report('x_norm', x.norm())
        return self.fc2(h)


# The floor of any design that calls an op from the compiled graph: the
# same 3 calls to a side-effectful custom op whose kernel does nothing.
_FLOOR_LIB = torch.library.Library('mmstats_bench', 'DEF')
_FLOOR_LIB.define('noop(Tensor value, str name, bool rank0) -> ()')
_FLOOR_LIB.impl('noop', lambda value, name, rank0: None,
                'CompositeExplicitAutograd')
torch.library.register_fake(
    'mmstats_bench::noop', lambda value, name, rank0: None, lib=_FLOOR_LIB)
has_side_effect(torch.ops.mmstats_bench.noop.default)


class _NoopOpMlp(_Mlp):

    def forward(self, x):
        h = self.fc1(x).relu()
        torch.ops.mmstats_bench.noop(h.mean(), 'h_mean', False)
        torch.ops.mmstats_bench.noop(h, 'h', False)
        torch.ops.mmstats_bench.noop(x.norm(), 'x_norm', False)
        return self.fc2(h)


class _SumMlp(_Mlp):
    """The floor of an exact in-graph reduction: one float64 sum of each
    reported tensor, fused by inductor, kept as an output (no op call)."""

    def forward(self, x):
        h = self.fc1(x).relu()
        sums = [t.double().sum() for t in (h.mean(), h, x.norm())]
        return self.fc2(h), torch.stack(sums)


def bench_compile(calls, repeats, backend='inductor', shapes=None):
    torch.set_num_threads(1)
    torch._dynamo.config.error_on_recompile = True
    collector = Collector()
    for batch, width in shapes or ((32, 64), (256, 1024)):
        torch._dynamo.reset()  # a new size is a new program, not a recompile
        x = torch.randn(batch, 64)
        models = {
            'compiled forward, no report()':
            torch.compile(_Mlp(width), backend=backend),
            'compiled forward, 3 report() calls':
            torch.compile(_ReportingMlp(width), backend=backend),
            'compiled forward, 3 no-op custom op calls (floor)':
            torch.compile(_NoopOpMlp(width), backend=backend),
            'compiled forward, 3 float64 sums in the graph (floor)':
            torch.compile(_SumMlp(width), backend=backend),
            'eager forward, 3 report() calls':
            _ReportingMlp(width),
        }
        for model in models.values():  # warm-up (compilation)
            with torch.no_grad():
                model(x)
                model(x)
        times = {label: [] for label in models}
        with torch.no_grad():
            for _ in range(repeats):  # interleaved repeats
                for label, model in models.items():
                    start = time.perf_counter()
                    for _ in range(calls):
                        model(x)
                    times[label].append(
                        (time.perf_counter() - start) / calls * 1e6)
                    collector.update()
        base = statistics.median(times['compiled forward, no report()'])
        print(f'## torch.compile ({backend}, CPU, 1 thread), MLP 64-{width}'
              f'-10, batch {batch}, {calls} calls x {repeats} interleaved '
              'repeats, median; no recompilation')
        for label, values in times.items():
            us = statistics.median(values)
            print(f'{label:62s} {us:8.2f} us  {us / base:5.2f}x')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--calls', type=int, default=5000)
    parser.add_argument('--repeats', type=int, default=15)
    parser.add_argument(
        '--only', choices=['report', 'compile', 'update', 'hook'])
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.repeats = 10, 1
    print(f'torch {torch.__version__}, CPU, 1 thread')
    if args.only in (None, 'report'):
        bench_report(args.calls, args.repeats)
    if args.only in (None, 'compile'):
        if args.smoke:  # the eager backend: the script, not inductor
            bench_compile(3, 1, backend='eager', shapes=((4, 8), ))
        else:
            bench_compile(200, max(args.repeats, 5))
    if args.only in (None, 'update'):
        bench_update(*((10, 2, 2) if args.smoke else ()))
    if args.only in (None, 'hook'):
        bench_hook(*((8, 1) if args.smoke else ()))


if __name__ == '__main__':
    main()
