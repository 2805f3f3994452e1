"""GPU benchmark of mmstats: precise BN, report() and the hooks' overhead.

Prints, measured side by side in this one run on one CUDA device
(interleaved repeats, medians, ``torch.cuda.synchronize`` around each timed
region), for a ResNet-50 (torchvision's when importable, else the same
network written here with torch.nn) on 224x224 inputs:

1. ``update_bn_stats`` time / the time of the same plain training-mode
   forwards under ``no_grad`` (batch 64 and 256, float32 and AMP float16),
   beside fvcore's ``update_bn_stats`` when fvcore is importable;
2. ``report()`` microseconds per call on CUDA tensors (0-d, 1024 and 1M
   elements; a Collector alive, ``update()`` between repeats, outside the
   timed region) beside StyleGAN3's ``training_stats.report``, re-written
   below (no package ships it), and inside a ``torch.compile``d forward;
3. StatsCollectorHook overhead in a real mmengine Runner training that
   ResNet-50 with AMP (batch 64): seconds per iteration with no mmstats hook
   (the model's ``report()`` calls are then no-ops), with the hook at the
   default interval (LoggerHook's, 10) and at interval 1, and the same with
   ModuleStatsHook added.

Usage: ``python tools/benchmarks/gpu.py [--quick] [--only bn|report|hook]``
"""
import argparse
import contextlib
import statistics
import sys
import time
import warnings
from typing import Callable, Dict, List

import torch
from torch import nn

from mmstats import Collector, report, update_bn_stats

sys.path.insert(0, __file__.rsplit('/', 1)[0])
import stylegan3_ref  # noqa: E402
from gpu_runner import hook_overhead  # noqa: E402

count_aten_ops = stylegan3_ref.count_aten_ops
stylegan3_report = stylegan3_ref.stylegan3_report
stylegan3_reset = stylegan3_ref.stylegan3_reset

IMAGE = 224


def resnet50() -> nn.Module:
    """torchvision's ResNet-50, or the same network built here."""
    try:
        from torchvision.models import resnet50 as tv_resnet50
        return tv_resnet50()
    except ImportError:
        pass

    class Bottleneck(nn.Module):

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False),
                nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False),
                    nn.BatchNorm2d(cout))

        def forward(self, x):
            skip = x if self.down is None else self.down(x)
            return torch.relu(self.body(x) + skip)

    layers = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1)
    ]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2),
                                  (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` takes, device work included."""
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - start


def interleaved(fns: Dict[str, Callable], repeats: int) -> Dict[str, float]:
    """Median seconds of each of ``fns``, run in turn ``repeats`` times after
    one warm-up round."""
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for rep in range(repeats + 1):
        for name, fn in fns.items():
            seconds = timed(fn)
            if rep:
                times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}


def bench_precise_bn(batch_sizes, num_samples: int, repeats: int) -> None:
    try:
        from fvcore.nn.precise_bn import update_bn_stats as fvcore_update
    except ImportError as e:
        fvcore_update = None
        print(f'(fvcore not importable: {e})')
    model = resnet50().cuda().train()
    print(f'\n== update_bn_stats on ResNet-50, {num_samples} samples of '
          f'{IMAGE}x{IMAGE}: time / plain forwards (median of {repeats}) ==')
    print(f'{"batch":>5} {"precision":>9} {"forwards s":>10} '
          f'{"mmstats":>8} {"fvcore":>8}')
    for batch_size in batch_sizes:
        num_batches = num_samples // batch_size
        batches = [
            torch.randn(batch_size, 3, IMAGE, IMAGE, device='cuda')
            for _ in range(num_batches)
        ]
        for precision in ('float32', 'amp-fp16'):
            med = _precise_bn_times(model, batches, precision != 'float32',
                                    repeats, fvcore_update)
            fv = (f'{med["fvcore"] / med["plain"]:8.3f}'
                  if 'fvcore' in med else f'{"n/a":>8}')
            print(f'{batch_size:5d} {precision:>9} {med["plain"]:10.3f} '
                  f'{med["mmstats"] / med["plain"]:8.3f} {fv}')
        batches.clear()
        torch.cuda.empty_cache()


def _precise_bn_times(model: nn.Module,
                      batches: List[torch.Tensor],
                      amp: bool,
                      repeats: int,
                      fvcore_update=None) -> Dict[str, float]:
    """Median seconds of the plain forwards, ours and fvcore's."""

    def context():
        return torch.autocast('cuda', torch.float16, enabled=amp)

    def plain():
        with torch.no_grad():
            for batch in batches:
                with context():
                    model(batch)

    def ours():
        update_bn_stats(
            model,
            batches,
            num_samples=sum(map(len, batches)),
            forward_context=context,
            progress=False)

    def fvcore():
        with context():
            fvcore_update(
                model, batches, num_iters=len(batches), progress=None)

    fns = dict(plain=plain, mmstats=ours)
    if fvcore_update is not None:
        fns['fvcore'] = fvcore
    return interleaved(fns, repeats)


SIZES = (0, 1024, 65536, 1048576)  # 0: a 0-d tensor


def bench_report(calls: int, repeats: int, device: str = 'cuda') -> None:
    """report() per call beside StyleGAN3's report at four sizes, float32
    and float16: ATen ops (exact) and microseconds with their ratio."""
    collector = Collector()
    print(f'\n== report() per call on {device} tensors beside StyleGAN3 '
          f'(median of {repeats} interleaved repeats) ==')
    print(f'{"value":>16} {"ops":>4} {"SG3 ops":>8} {"us":>9} '
          f'{"SG3 us":>9} {"ratio":>6}')
    for dtype in (torch.float32, torch.float16):
        for numel in SIZES:
            value = torch.randn(
                numel if numel else (), device=device).to(dtype) + 3
            report('bench/value', value)  # steady state for both
            stylegan3_report('bench/value', value)
            ops = len(count_aten_ops(lambda: report('bench/value', value)))
            sg3_ops = len(
                count_aten_ops(lambda: stylegan3_report('bench/value', value)))
            n = max(calls * 1024 // max(numel, 1024), 3)

            def loop(fn, value=value, n=n):

                def run():
                    for _ in range(n):
                        fn('bench/value', value)

                return run

            med = interleaved(
                dict(mmstats=loop(report), sg3=loop(stylegan3_report)),
                repeats)
            collector.update()
            label = f'{numel or "0-d"} {str(dtype)[6:]}'
            print(f'{label:>16} {ops:>4} {sg3_ops:>8} '
                  f'{med["mmstats"] / n * 1e6:9.2f} '
                  f'{med["sg3"] / n * 1e6:9.2f} '
                  f'{med["mmstats"] / med["sg3"]:5.2f}x')
    stylegan3_reset()
    bench_compiled_report(calls, repeats, collector, device)


def dry_run() -> None:
    """The CPU-side logic of this script, without a GPU: report() rows with
    few calls, and the overhead statistics on made-up paired times."""
    from gpu_runner import print_overheads
    torch.set_num_threads(1)
    bench_report(20, 2, device='cpu')
    gen = torch.Generator().manual_seed(0)
    base = (0.1 + 0.001 * torch.rand(20, generator=gen)).tolist()
    print_overheads({
        'no mmstats hook':
        base,
        'StatsCollectorHook (interval 10)': [b * 1.004 for b in base],
    })


def bench_compiled_report(calls: int,
                          repeats: int,
                          collector,
                          device: str = 'cuda') -> None:
    """A compiled MLP forward with and without 3 report() calls."""

    class MLP(nn.Module):

        def __init__(self, reports: bool) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(256, 256), nn.Linear(256, 10)
            self.reports = reports

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            if self.reports:
                report('mlp/h_mean', h.mean())
                report('mlp/h_norm', h.norm(dim=1))
                report('mlp/h', h)
            return self.fc2(h)

    x = torch.randn(64, 256, device=device)
    fns = {}
    for reports in (False, True):
        compiled = torch.compile(MLP(reports).to(device))
        fns[reports] = (lambda c=compiled: [c(x) for _ in range(calls)])
    try:
        med = interleaved(fns, repeats)
    except Exception as e:  # e.g. recompilation limits
        print(f'compiled forward with report(): failed ({type(e).__name__}:'
              f' {e})'.splitlines()[0])
        return
    collector.update()
    print(f'compiled MLP forward: {med[False] / calls * 1e6:.1f} us, with 3 '
          f'report() calls {med[True] / calls * 1e6:.1f} us '
          f'({med[True] / med[False]:.3f}x)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--quick', action='store_true', help='fewer repeats (a smoke run)')
    parser.add_argument('--only', choices=('bn', 'report', 'hook'))
    parser.add_argument(
        '--hook-repeats',
        type=int,
        default=20,
        help='paired rounds of interleaved Runner runs (>= 20 for the '
        'confidence interval the targets need)')
    parser.add_argument(
        '--all-configs',
        action='store_true',
        help='also the hooks at interval 1 (longer)')
    parser.add_argument(
        '--dry-run',
        action='store_true',
        help='check the script on CPU: report() rows with few calls and '
        'the overhead statistics on made-up times; no GPU needed')
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='the same as --dry-run (every script of tools/benchmarks has it)')
    args = parser.parse_args()
    if args.dry_run or args.smoke:
        dry_run()
        return
    if not torch.cuda.is_available():
        sys.exit('tools/benchmarks/gpu.py needs a CUDA device (none is '
                 'visible to torch here); the CPU benchmarks are '
                 'tools/benchmarks/precise_bn.py and report.py')
    torch.backends.cudnn.benchmark = True
    warnings.simplefilter('ignore')  # deprecations of torch/mmengine APIs
    props = torch.cuda.get_device_properties(0)
    print(f'device: {props.name}, {props.total_memory / 2**30:.0f} GiB; '
          f'torch {torch.__version__}, CUDA {torch.version.cuda}; '
          f'{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}')
    quick = args.quick
    if args.only in (None, 'bn'):
        bench_precise_bn((64, 256), 512 if quick else 2048, 2 if quick else 5)
    if args.only in (None, 'report'):
        bench_report(200 if quick else 1000, 3 if quick else 7)
    if args.only in (None, 'hook'):
        hook_overhead(
            resnet50,
            iters=20 if quick else 60,
            repeats=2 if quick else args.hook_repeats,
            all_configs=args.all_configs)


if __name__ == '__main__':
    with contextlib.suppress(KeyboardInterrupt):
        main()
