"""ThroughputHook in real mmengine Runners (1 and 2 gloo processes): every
published figure is recomputed from what each rank saw (the rows of its
batches, its iteration times on a fake clock, its memory readings, the toy
model's FLOPs counted by hand), with the iterations it covers."""
import math
import os.path as osp

import pytest
import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.runner import Runner
from torch.utils._python_dispatch import TorchDispatchMode

import mmstats.hooks.precise_bn_hook as precise_bn_hook
import mmstats.hooks.throughput_hook as throughput_hook
from mmstats.hooks import ThroughputHook
from mmstats.throughput import MemoryReader
from tests.helpers.dist import run_distributed
from tests.helpers.runner import gloo_launch, read_scalars, toy_cfg
from tests.helpers.toy import toy_flops_per_sample


# ----------------------------------------------------- the raw values seen
class FakeClock:
    """``perf_counter`` of the hook: moves only when a test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeMemory:
    """``MemoryReader.read`` returning a known, rank-dependent figure per
    call, with a log of the calls (and of the iterations, see
    :class:`RawValuesHook`)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.log = []

    def __get__(self, reader, owner=None):  # a method of MemoryReader
        return self if reader is None else lambda: self(reader)

    def __call__(self, reader) -> dict:
        k = sum(1 for entry in self.log if entry[0] == 'read')
        value = 100.0 + (k * 7 + 5 * self.rank) % 11
        self.log.append(('read', value))
        return {name: value for name in reader.names}


def slowed(function, seconds: float):
    """``function`` taking ``seconds`` on the fake clock."""

    def slow(*args, **kwargs):
        throughput_hook.perf_counter.now += seconds
        return function(*args, **kwargs)

    return slow


@ROOT_HOOKS.register_module(force=True)
class RawValuesHook(Hook):
    """Each iteration takes ``(iter + 1) * (rank + 1) / 4`` fake seconds;
    validation iterations and the time between epochs take 1000 and 500
    (neither may count); records every batch's rows."""
    priority = 'VERY_HIGH'  # the iteration's time runs before the hook's

    def __init__(self):
        self.rows, self.durations = [], []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        from mmengine.dist import get_rank
        seconds = (runner.iter + 1) * (get_rank() + 1) / 4
        throughput_hook.perf_counter.now += seconds
        self.durations.append(seconds)
        self.rows.append(len(data_batch['inputs']))

    def before_val_iter(self, runner, batch_idx, data_batch=None):
        throughput_hook.perf_counter.now += 1000.0


@ROOT_HOOKS.register_module(force=True)
class ThroughputMarksHook(Hook):
    """After ThroughputHook: marks each iteration's end in the memory log
    and lets 500 fake seconds pass between epochs."""
    priority = 'LOW'

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        MemoryReader.read.log.append(('iter', runner.iter + 1))

    def after_train_epoch(self, runner):
        throughput_hook.perf_counter.now += 500.0


def _hook(runner, cls):
    return [h for h in runner.hooks if isinstance(h, cls)][0]


def _train(rank,
           world_size,
           work_dir,
           cfg_args,
           hook_args=None,
           precise_bn=False):
    """Train the toy model with ThroughputHook on a fake clock and fake
    memory readings; return the raw values and what was published. The
    hook's publication takes 250 fake seconds (its collective: in no
    interval); with ``precise_bn`` a PreciseBNHook (priority ABOVE_NORMAL:
    its after_train_epoch runs before ThroughputHook's) recomputes the BN
    statistics after every epoch in 1000 fake seconds (in no interval)."""
    fake_memory = FakeMemory(rank)
    saved = (throughput_hook.perf_counter, MemoryReader.read,
             throughput_hook.reduce_interval, precise_bn_hook.update_bn_stats)
    throughput_hook.perf_counter = FakeClock()
    MemoryReader.read = fake_memory
    throughput_hook.reduce_interval = slowed(saved[2], 250.0)
    precise_bn_hook.update_bn_stats = slowed(saved[3], 1000.0)
    try:
        cfg = toy_cfg(work_dir, **cfg_args)
        if world_size > 1:
            gloo_launch(cfg)
        cfg.custom_hooks = [
            dict(type='mmstats.ThroughputHook', **(hook_args or {})),
            dict(type='RawValuesHook'),
            dict(type='ThroughputMarksHook')
        ]
        if precise_bn:
            cfg.custom_hooks.append(
                dict(type='mmstats.PreciseBNHook', num_samples=16))
        runner = Runner.from_cfg(cfg)
        runner.train()
    finally:
        (throughput_hook.perf_counter, MemoryReader.read,
         throughput_hook.reduce_interval,
         precise_bn_hook.update_bn_stats) = saved
    raw = _hook(runner, RawValuesHook)
    return dict(
        rows=raw.rows,
        durations=raw.durations,
        memory_log=fake_memory.log,
        hub={
            key: runner.message_hub.log_scalars[f'train/{key}'].current()
            for key in ('memory/max', 'samples_per_s', 'mfu')
            if f'train/{key}' in runner.message_hub.log_scalars
        },
        scalars=read_scalars(runner, missing_ok=True),
        log=open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read())


def _memory_maxima(logs, steps):
    """``{step: (max, rank)}`` of the memory readings of each interval:
    every reading since the previous publication's, up to its own."""
    per_rank = []
    for log in logs:
        groups, current = {}, []
        for kind, value in log:
            if kind == 'read':
                current.append(value)
            elif value in steps:
                groups[value], current = max(current), []
        per_rank.append(groups)
    out = {}
    for step in steps:
        column = [groups[step] for groups in per_rank]
        best = max(column)
        out[step] = (best, column.index(best))  # the lowest rank on a tie
    return out


def check_publications(results, steps, texts, per_sample, peak=None):
    """Every published figure of every step against the raw values (MFU
    against ``peak``, the peak FLOP/s of one device, times the ranks)."""
    scalars = results[0]['scalars']
    published = sorted(s for s, r in scalars.items()
                       if 'throughput/samples' in r)
    assert published == steps
    memory = _memory_maxima([r['memory_log'] for r in results], steps)
    start = 0
    for step in steps:
        record = scalars[step]
        samples = sum(sum(r['rows'][start:step]) for r in results)
        seconds = max(sum(r['durations'][start:step]) for r in results)
        assert record['throughput/iters'] == step - start
        assert record['throughput/samples'] == samples
        assert record['throughput/time'] == seconds
        assert record['throughput/samples_per_s'] == pytest.approx(
            samples / seconds, rel=1e-12)
        assert record['throughput/iters_per_s'] == pytest.approx(
            (step - start) / seconds, rel=1e-12)
        assert record['throughput/flops'] == pytest.approx(
            samples * per_sample, rel=1e-12)
        assert record['throughput/flops_per_s'] == pytest.approx(
            samples * per_sample / seconds, rel=1e-12)
        assert record['memory/max_rss'] == memory[step][0]
        assert record['memory/max_rss_rank'] == memory[step][1]
        if peak is None:
            assert 'throughput/mfu' not in record  # no peak known on a CPU
        else:
            assert record['throughput/mfu'] == pytest.approx(
                samples * per_sample / seconds / (len(results) * peak),
                rel=1e-12)
        if step in texts:  # LoggerHook's line: the short keys
            assert record['samples_per_s'] == record[
                'throughput/samples_per_s']
            assert record['memory/max'] == record['memory/max_rss']
            assert record.get('mfu') == record.get('throughput/mfu')
        else:
            assert 'samples_per_s' not in record
            assert 'mfu' not in record
        start = step


# ------------------------------------------------------------ real Runners
def test_epochs_with_an_uneven_last_batch(tmp_path, clean_mmengine):
    """7 iterations per epoch (the last of 5 samples), a line every 3:
    publications at 3, 6, 7 and 10, 13, 14; the validation loops, the
    publications' collectives and the time between epochs (precise BN's
    recomputation, before ThroughputHook's after_train_epoch, included)
    are in no interval."""
    result = _train(
        0,
        1,
        str(tmp_path),
        dict(num_samples=53, batch_size=8, log_interval=3),
        precise_bn=True)
    assert result['rows'] == [8] * 6 + [5] + [8] * 6 + [5]
    assert result['log'].count('PreciseBN (model)') == 2  # took 2000 s
    check_publications([result], [3, 6, 7, 10, 13, 14], {3, 6, 10, 13},
                       toy_flops_per_sample())
    line = [ln for ln in result['log'].splitlines() if '[2][6/7]' in ln][0]
    assert '  memory/max: ' in line and '  samples_per_s: ' in line
    assert '  mfu: ' not in line
    assert result['log'].count('mfu is not published') == 1  # said once
    # at INFO: a CPU has no known peak, nothing asked for is missing
    assert result['log'].count('INFO - ThroughputHook: mfu is not') == 1
    assert result['log'].count(
        f'ran {8 * toy_flops_per_sample() / 1e9:.4g} GFLOP') == 1


def test_validation_inside_an_interval_is_not_in_it(tmp_path, clean_mmengine):
    """Iteration-based: validation after iteration 4 (inside 4-6), the last
    iteration (8) published without a line of LoggerHook's."""
    result = _train(
        0, 1, str(tmp_path),
        dict(by_epoch=False, max_iters=8, val_interval=4, log_interval=3))
    check_publications([result], [3, 6, 8], {3, 6}, toy_flops_per_sample())
    ours = {
        k
        for k in result['scalars'][3]
        if k.startswith(('throughput/', 'memory/'))
    }
    assert ours == {
        'memory/max_rss', 'memory/max_rss_rank', 'memory/max',
        'throughput/iters', 'throughput/time', 'throughput/iters_per_s',
        'throughput/samples', 'throughput/samples_per_s', 'throughput/flops',
        'throughput/flops_per_s'
    }  # the keys written: no mfu without a peak
    # the memory read before validation is in the interval 4-6, and it is
    # that interval's peak
    reads = [v for kind, v in result['memory_log'] if kind == 'read']
    assert len(reads) == 5  # 3 publications, 2 validation loops
    assert reads[:3] == [100.0, 107.0, 103.0]
    assert result['scalars'][6]['memory/max_rss'] == 107.0


def test_peak_flops_gives_mfu_and_count_flops_false_none(
        tmp_path, clean_mmengine):
    result = _train(0, 1, str(tmp_path / 'peak'),
                    dict(by_epoch=False, max_iters=4, log_interval=2),
                    dict(peak_flops=1e9))
    scalars = result['scalars']
    for step in (2, 4):
        assert scalars[step]['throughput/mfu'] == pytest.approx(
            scalars[step]['throughput/flops_per_s'] / 1e9, rel=1e-12)
        assert scalars[step]['mfu'] == scalars[step]['throughput/mfu']
    result = _train(0, 1, str(tmp_path / 'off'),
                    dict(by_epoch=False, max_iters=4, log_interval=2),
                    dict(count_flops=False, peak_flops=1e9))
    for step in (2, 4):
        record = result['scalars'][step]
        assert 'throughput/flops' not in record
        assert 'throughput/mfu' not in record
        assert record['throughput/samples'] == 32
    assert 'GFLOP' not in result['log']


@ROOT_HOOKS.register_module(force=True)
class ScalarBatchHook(Hook):
    """Hides the batch size from ThroughputHook on one rank."""
    priority = 'HIGH'

    def __init__(self, rank=0):
        self.rank = rank

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        from mmengine.dist import get_rank
        if get_rank() == self.rank and batch_idx == 2:
            data_batch['inputs'] = torch.tensor(1.)


def test_a_batch_without_rows_takes_samples_out_with_a_warning(
        tmp_path, clean_mmengine):
    cfg = toy_cfg(tmp_path, by_epoch=False, max_iters=6, log_interval=3)
    cfg.custom_hooks = [
        dict(type='mmstats.ThroughputHook'),
        dict(type='ScalarBatchHook')
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    scalars = read_scalars(runner)
    assert 'throughput/samples' not in scalars[3]
    assert 'throughput/samples_per_s' not in scalars[3]
    assert 'samples_per_s' not in scalars[3]
    # FLOPs per iteration where the samples are not known
    assert scalars[3]['throughput/flops'] == 3 * 16 * toy_flops_per_sample()
    assert scalars[6]['throughput/samples'] == 48  # the next interval
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert log.count('the number of samples of a training batch could not '
                     'be found on some rank (this rank: dict)') == 1


# ------------------------------------------------------------ distributed
def test_two_ranks_uneven_last_batches(tmp_path):
    """80 samples on 2 ranks: 16, 16, 8 per rank and epoch; rank 1's
    iterations take twice as long; the figures are the sums and maxima
    over both ranks, identical on both; MFU is over both devices' peaks."""
    results = run_distributed(
        _train,
        2,
        str(tmp_path),
        dict(num_samples=80, batch_size=16, log_interval=2),
        dict(peak_flops=1e9),
        timeout=240)
    assert [r['rows'] for r in results] == [[16, 16, 8] * 2] * 2
    check_publications(results, [2, 3, 5, 6], {2, 5}, toy_flops_per_sample(),
                       1e9)
    maxima = _memory_maxima([r['memory_log'] for r in results], [2, 3, 5, 6])
    assert {rank for _, rank in maxima.values()} == {0, 1}  # both hold one
    # both ranks' lines show the same (the last line's, at 5)
    assert results[0]['hub'] == results[1]['hub'] == {
        'memory/max': results[0]['scalars'][5]['memory/max_rss'],
        'samples_per_s': results[0]['scalars'][5]['throughput/samples_per_s'],
        'mfu': results[0]['scalars'][5]['throughput/mfu']
    }


class FakeAllocator:
    """The CUDA allocator's peak counters as ``MemoryReader`` sees them:
    ``read`` gives the peak since the last ``reset``, which starts from the
    memory held then. :class:`AllocatorHook` sets what each iteration holds
    (validation holds 1e6 MiB: never in a training figure)."""

    def __init__(self) -> None:
        self.held = self.peak = 0.0
        self.usage = []  # per training iteration

    def hold(self, mib: float) -> None:
        self.held = mib
        self.peak = max(self.peak, mib)

    def read(self) -> dict:  # bound: the reader is not passed
        return dict(max_allocated=self.peak, max_reserved=2 * self.peak)

    def reset(self) -> None:
        self.peak = self.held


@ROOT_HOOKS.register_module(force=True)
class AllocatorHook(Hook):
    priority = 'VERY_HIGH'

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        from mmengine.dist import get_rank
        allocator = MemoryReader.read.__self__
        allocator.usage.append(10.0 + (runner.iter *
                                       (7 + get_rank()) + 6 * get_rank()) % 13)
        allocator.hold(allocator.usage[-1])

    def before_val_iter(self, runner, batch_idx, data_batch=None):
        MemoryReader.read.__self__.hold(1e6)

    def after_val_epoch(self, runner, metrics=None):
        MemoryReader.read.__self__.hold(0.0)  # validation freed its memory


def _train_cuda_peaks(rank, world_size, work_dir):
    allocator = FakeAllocator()
    saved = MemoryReader.read, MemoryReader.reset
    MemoryReader.read, MemoryReader.reset = allocator.read, allocator.reset
    try:
        cfg = gloo_launch(
            toy_cfg(
                work_dir,
                by_epoch=False,
                max_iters=8,
                val_interval=4,
                log_interval=3))
        cfg.custom_hooks = [
            dict(type='mmstats.ThroughputHook', count_flops=False),
            dict(type='AllocatorHook')
        ]
        runner = Runner.from_cfg(cfg)
        runner.train()
    finally:
        MemoryReader.read, MemoryReader.reset = saved
    return dict(
        usage=allocator.usage, scalars=read_scalars(runner, missing_ok=True))


def test_two_ranks_cuda_peaks_per_interval_without_validation(tmp_path):
    """The CUDA path's reads and resets on a simulated allocator: each
    interval's peak is the max of what its iterations held (and what the
    previous iteration still held when the peaks were reset), max over
    ranks, with the rank; validation's memory is in none of them."""
    results = run_distributed(_train_cuda_peaks, 2, str(tmp_path), timeout=240)
    scalars = results[0]['scalars']
    start = 0
    for step in (3, 6, 8):
        column = [max(r['usage'][max(start - 1, 0):step]) for r in results]
        record = scalars[step]
        assert record['memory/max_allocated'] == max(column)
        assert record['memory/max_allocated_rank'] == column.index(max(column))
        assert record['memory/max_reserved'] == 2 * max(column)
        if step != 8:  # LoggerHook's lines: 3, 6
            assert record['memory/max'] == max(column)
        assert 'memory/max_rss' not in record
        start = step
    assert {scalars[s]['memory/max_allocated_rank']
            for s in (3, 6, 8)} == {0, 1}


class OpCounter(TorchDispatchMode):
    """Counts every tensor op dispatched."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _count_work(rank, world_size, work_dir):
    """Per call of the hook's iteration methods: its collectives and the
    tensor ops it dispatched (none on a non-publication iteration)."""
    cfg = gloo_launch(
        toy_cfg(work_dir, by_epoch=False, max_iters=7, log_interval=3))
    cfg.custom_hooks = [dict(type='mmstats.ThroughputHook')]
    runner = Runner.from_cfg(cfg)
    hook = _hook(runner, ThroughputHook)
    calls = []
    collectives = []
    saved = {}
    for name in ('all_gather', 'all_reduce', 'broadcast',
                 'all_gather_into_tensor', 'all_gather_object'):
        real = saved[name] = getattr(dist, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            collectives.append(_name)
            return _real(*args, **kwargs)

        setattr(dist, name, counted)

    def wrap(method_name):
        method = getattr(hook, method_name)

        def wrapped(runner, batch_idx, *args, **kwargs):
            # FlopCounterMode starts and stops inside the counted
            # iteration: no mode of the test's around that
            counting = hook._run_iters == throughput_hook.COUNTED_ITERATION - 1
            before = len(collectives)
            if counting:
                method(runner, batch_idx, *args, **kwargs)
                ops = None
            else:
                with OpCounter() as counter:
                    method(runner, batch_idx, *args, **kwargs)
                ops = counter.ops
            calls.append(
                (method_name, runner.iter + 1, ops, collectives[before:]))

        setattr(hook, method_name, wrapped)

    wrap('before_train_iter')
    wrap('after_train_iter')
    try:
        runner.train()
    finally:
        for name, real in saved.items():
            setattr(dist, name, real)
    return calls


def test_no_collective_and_no_tensor_op_between_publications(tmp_path):
    results = run_distributed(_count_work, 2, str(tmp_path), timeout=240)
    assert results[0] == results[1]
    for method, step, ops, collectives in results[0]:
        published = method == 'after_train_iter' and step in (3, 6, 7)
        assert collectives == (['all_gather'] if published else []), (method,
                                                                      step)
        if not published and ops is not None:
            assert ops == [], (method, step)
    assert sum(len(c) for *_, c in results[0]) == 3  # one per publication


@pytest.mark.parametrize('kwargs, error', [
    (dict(interval=0), ValueError),
    (dict(interval=True), TypeError),
    (dict(count_flops=1), TypeError),
    (dict(peak_flops='989e12'), TypeError),
    (dict(peak_flops=True), TypeError),
    (dict(peak_flops=0.0), ValueError),
    (dict(peak_flops=math.inf), ValueError),
    (dict(peak_flops=math.nan), ValueError),
])
def test_config_mistakes_fail_when_built(kwargs, error):
    with pytest.raises(error, match=f'ThroughputHook: {next(iter(kwargs))}'):
        ThroughputHook(**kwargs)


@ROOT_HOOKS.register_module(force=True)
class ReportsMemoryHook(Hook):
    """A user's reported name ``memory``: StatsCollectorHook's text key
    ``memory/max`` is ThroughputHook's too."""

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        from mmstats import report
        report('memory', 1.0)


def test_another_hook_writing_memory_max_is_warned_once(
        tmp_path, clean_mmengine):
    cfg = toy_cfg(tmp_path, by_epoch=False, max_iters=6, log_interval=2)
    cfg.custom_hooks = [
        dict(type='ReportsMemoryHook'),
        dict(type='mmstats.ThroughputHook', count_flops=False),
        dict(
            type='mmstats.StatsCollectorHook',
            stats=('mean', 'max'),
            log_stats=('max', ))
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert log.count("another hook writes 'train/memory/max' too") == 1
    scalars = read_scalars(runner)
    assert scalars[4]['stats/memory/max'] == 1.0  # both kept apart here
    assert scalars[4]['memory/max_rss'] > 1.0
