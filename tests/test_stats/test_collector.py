"""Tests of mmstats.stats.Collector in one process: exactness, isolation,
bounded names, arguments."""
import gc
import math
import re
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from mmstats.stats import Collector, report, report0, reporting
from mmstats.stats.pending import (MAX_PENDING_NUMBERS, MAX_PENDING_ROWS,
                                   MAX_PENDING_TENSORS)
from mmstats.stats.protocol import ReduceFns
from mmstats.stats.reporting import REPORTER


@pytest.fixture(autouse=True)
def _clean_state():
    """No collector or pending value leaks from one test into the next."""
    reporting.REPORTER._collectors.clear()
    reporting.reset()
    yield
    reporting.REPORTER._collectors.clear()
    reporting.reset()


def _close(a, b, rel=1e-9):
    if math.isnan(b):
        return math.isnan(a)
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def expected(values):
    """Exact numpy float64 statistics of ``values``."""
    x = np.asarray(values, dtype=np.float64).ravel()
    fin = x[np.isfinite(x)]
    if fin.size == 0:
        return dict(
            num=0.,
            mean=math.nan,
            std=math.nan,
            min=math.nan,
            max=math.nan,
            nonfinite=float(x.size))
    return dict(
        num=float(fin.size),
        mean=float(fin.mean()),
        std=float(fin.std()),
        min=float(fin.min()),
        max=float(fin.max()),
        nonfinite=float(x.size - fin.size))


def assert_stats(got, values, name=''):
    exp = expected(values)
    assert set(got) == {'num', 'mean', 'std', 'min', 'max', 'nonfinite'}
    for key, val in exp.items():
        assert _close(got[key], val), (name, key, got[key], val)


def check(collector, name, values):
    assert_stats(collector.as_dict()[name], values, name)
    assert collector.num(name) == expected(values)['num']


# --------------------------------------------------------------------------
# Exactness, single process
# --------------------------------------------------------------------------
@pytest.mark.parametrize('dtype', [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
    torch.int64, torch.uint8, torch.bool
])
@pytest.mark.parametrize('shape', [(), (7, ), (3, 4, 5), (70, 70)])
def test_tensor_dtypes_shapes(dtype, shape):
    gen = torch.Generator().manual_seed(0)
    values = []
    c = Collector()
    for _ in range(3):
        t = (torch.randn(shape, generator=gen) * 10).to(dtype)
        assert report('x', t) is t
        values.append(t.double().numpy().ravel())
    c.update()
    check(c, 'x', np.concatenate(values))


def test_python_numbers_sequences_arrays():
    c = Collector()
    vals = {
        'int': [3, -7, 2**40],
        'float': [0.5, -1e-3, 3e8],
        'bool': [True, False, True],
        'list': [[1.0, 2, True], (4.5, 6.25), [[1, 2], [3, 4]]],
        'np': [
            np.arange(6.).reshape(2, 3),
            np.array([1, 2], np.int16),
            np.float32(2.5),
            np.int64(9),
            np.bool_(True)
        ],
        'tensors': [[torch.tensor(1.),
                     torch.tensor([2., 3.])]],
    }
    for name, items in vals.items():
        for v in items:
            assert report(name, v) is v
    c.update()
    for name, items in vals.items():
        flat = np.concatenate([
            np.concatenate([np.asarray(t, np.float64).ravel()
                            for t in v]) if name == 'tensors' else np.asarray(
                                v, np.float64).ravel() for v in items
        ])
        check(c, name, flat)


def test_empty_values_register_name():
    c = Collector()
    for v in (torch.empty(0), [], (), np.empty((0, 3)), torch.empty(2, 0)):
        assert report('empty', v) is v
    report('other', 1.0)
    c.update()
    assert c.names() == ['empty', 'other']
    assert c.num('empty') == 0 and c.nonfinite('empty') == 0
    assert math.isnan(c.mean('empty')) and math.isnan(c['empty'])


def test_large_mean_small_std_is_exact():
    rng = np.random.default_rng(1)
    c = Collector()
    values = []
    for i in range(600):  # crosses the compaction thresholds
        v = rng.normal(1e6, 1.0, size=(4, ))
        report('t', torch.from_numpy(v))
        report('f', float(v[0]))
        values.append(v)
    big = rng.normal(1e6, 1.0, size=10000)
    report('t', torch.from_numpy(big))  # reduced at report time
    c.update()
    check(c, 't', np.concatenate(values + [big]))
    check(c, 'f', np.array([v[0] for v in values]))
    assert abs(c.std('t') - 1) < 0.05


def test_memory_is_bounded():
    c = Collector()
    for i in range(3000):
        report('x', torch.tensor(float(i)))
    assert len(REPORTER.store.tensors.get('x', [])) < MAX_PENDING_TENSORS
    assert len(REPORTER.store.rows['x']) < MAX_PENDING_ROWS
    for i in range(MAX_PENDING_NUMBERS + 10):
        report('f', 0.5 * i)
    assert len(REPORTER.store.numbers['f']) < MAX_PENDING_NUMBERS
    c.update()
    check(c, 'x', np.arange(3000.))
    check(c, 'f', 0.5 * np.arange(MAX_PENDING_NUMBERS + 10.))


def test_compaction_mixed_shapes_dtypes():
    c = Collector()
    values = []
    for i in range(700):
        t = torch.arange(i % 4, dtype=torch.float32) * 0.1 + i
        t = t.half() if i % 3 == 0 else t
        report('x', t if i % 5 else t.sum())
        values.append(t.double().numpy().ravel() if i %
                      5 else [t.sum().double().item()])
    c.update()
    check(c, 'x', np.concatenate(values))


@pytest.mark.parametrize('numel', [5, 10000])
def test_inplace_change_after_report(numel):
    c = Collector()
    t = torch.arange(numel, dtype=torch.float64)
    a = np.arange(numel, dtype=np.float32)
    lst = [1.0, 2.0]
    report('t', t)
    report('a', a)
    report('l', lst)
    t.mul_(-3)
    a *= 5
    lst.append(100.)
    c.update()
    check(c, 't', np.arange(numel))
    check(c, 'a', np.arange(numel))
    check(c, 'l', [1.0, 2.0])


def test_regex_fullmatch():
    # re.match would also take 'loss_cls', re.search also 'my_loss'
    c = Collector(regex='loss|acc')
    for name in ('loss', 'loss_cls', 'acc', 'my_loss', 'acc2'):
        report(name, 1.0)
    c.update()
    assert c.names() == ['acc', 'loss']


@pytest.mark.parametrize('keep', [True, False])
def test_keep_previous(keep):
    c = Collector(keep_previous=keep)
    report('a', [1.0, 3.0])
    report('b', 5.0)
    c.update()
    report('b', 7.0)
    c.update()
    assert c.names() == ['a', 'b']
    check(c, 'b', [7.0])
    if keep:
        check(c, 'a', [1.0, 3.0])
    else:
        assert c.num('a') == 0 and math.isnan(c.mean('a'))


def test_two_collectors_different_rates():
    fast, slow = Collector(), Collector(regex='x|y')
    rng = np.random.default_rng(2)
    window = []
    for step in range(9):
        v = rng.normal(size=3)
        report('x', torch.from_numpy(v).float())
        report('z', float(step))
        window.append(torch.from_numpy(v).float().double().numpy())
        fast.update()
        check(fast, 'x', window[-1])
        check(fast, 'z', [step])
        if step % 3 == 2:
            slow.update()
            check(slow, 'x', np.concatenate(window))
            assert slow.names() == ['x']
            window = []


def test_new_collector_sees_only_later_values():
    old = Collector()
    report('x', 1.0)
    new = Collector()
    report('x', 3.0)
    new.update()
    old.update()
    check(new, 'x', [3.0])
    check(old, 'x', [1.0, 3.0])


def test_nonfinite_counted_separately():
    c = Collector()
    report('x', torch.tensor([1., float('nan'), 3., float('inf')]))
    report('x', float('-inf'))
    report('x', torch.full((5000, ), float('nan')))
    report('y', float('nan'))
    c.update()
    check(c, 'x', [1., 3.] + [math.nan] * 5003)
    assert c.nonfinite('x') == 5003 and c.mean('x') == 2.0
    assert c.num('y') == 0 and c.nonfinite('y') == 1
    assert math.isnan(c.mean('y'))


def test_autograd_no_grad_and_module_forward():

    class Net(nn.Module):

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x):
            y = report('act', self.lin(x))
            return report('out', y.sum())

    c = Collector()
    net = Net()
    x = torch.randn(4, 3)
    out = net(x)
    out.backward()  # report kept the graph intact
    assert net.lin.weight.grad is not None
    w = torch.randn(3, requires_grad=True)
    assert report('w', w) is w
    with torch.no_grad():
        net(x)
    c.update()
    act = net.lin(x).detach().numpy().ravel()
    check(c, 'act', np.concatenate([act, act]))
    check(c, 'w', w.detach().numpy())
    check(c, 'out', [out.item(), out.item()])


def test_no_collector_is_noop():
    t = torch.tensor(1.)
    assert report('x', t) is t
    bad = 'not checked without a collector'
    assert report('x', bad) is bad
    assert not REPORTER.store.tensors and not REPORTER.store.numbers
    c = Collector()
    c.update()
    assert c.names() == [] and c.as_dict() == {}
    del c
    report('x', 1.0)
    assert not REPORTER.store.numbers  # none kept once the last one died


@pytest.mark.parametrize('bad', [
    'str', None, {
        'a': 1
    },
    np.array(['a'], dtype=object),
    torch.zeros(2, dtype=torch.complex64), ['a', 'b'],
    object()
])
def test_type_error_names_statistic(bad):
    Collector()  # keep a collector alive for the duration of the call
    c = Collector()
    with pytest.raises(TypeError, match=r"report\('my_stat'\)"):
        report('my_stat', bad)
    del c


def test_report0_single_process():
    c = Collector()
    v = torch.tensor([1., 2.])
    assert report0('r0', v) is v
    c.update()
    check(c, 'r0', [1., 2.])


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_report_never_syncs():
    c = Collector()
    small = torch.randn(10, device='cuda')
    large = torch.randn(20000, device='cuda', dtype=torch.float16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        for _ in range(300):  # crosses compaction thresholds
            report('s', small)
            report('l', large)
            report('z', small.sum())
            report0('r0', small[0])
    finally:
        torch.cuda.set_sync_debug_mode('default')
    c.update()
    check(c, 's', np.tile(small.double().cpu().numpy(), 300))
    check(c, 'l', np.tile(large.double().cpu().numpy(), 300))


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(regex='['), ValueError, 'regex .* is not a valid'),
    (dict(regex=None), TypeError, 'regex must be a str'),
    (dict(keep_previous='no'), TypeError, 'keep_previous must be True or'),
    (dict(keep_previous=1), TypeError, 'keep_previous must be True or'),
])
def test_bad_arguments_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        Collector(**kwargs)
    assert not reporting.REPORTER.live_collectors(
    )  # nothing half-built stays alive


def test_inline_flags_work():
    c = Collector('(?i)loss')
    report('LOSS', 1.0)
    report('loss_x', 1.0)
    c.update()
    assert c.names() == ['LOSS']


@pytest.mark.parametrize('kwargs, error', [
    (dict(max_names=0), ValueError),
    (dict(max_names=1.5), TypeError),
    (dict(max_names=True), TypeError),
    (dict(evict_after=0), ValueError),
    (dict(evict_after='10'), TypeError),
])
def test_bounds_must_be_positive_ints(kwargs, error):
    with pytest.raises(
            error, match=f'{next(iter(kwargs))} must be a '
            'positive int'):
        Collector(**kwargs)


def test_compiled_pattern_is_fullmatched():
    c = Collector(re.compile('loss', re.IGNORECASE))
    for name in ('LOSS', 'loss_x', 'my_loss'):
        report(name, 2.0)
    c.update()
    assert c.names() == ['LOSS']


class _CountingFns(ReduceFns):
    """One-process collectives that record each call's size."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def all_reduce_sum(self, x):
        self.calls.append(x.size)
        return super().all_reduce_sum(x)

    def all_reduce_max(self, x):
        self.calls.append(x.size)
        return super().all_reduce_max(x)

    def all_gather_object(self, obj):
        self.calls.append(0)
        return super().all_gather_object(obj)


def test_names_stay_bounded_and_updates_stay_cheap():
    """5000 distinct names, one per step, update() every 10 steps: the
    table stays bounded and so does the work of an update (counted as
    collectives and the numbers they reduce; the timing is in
    tools/benchmarks/collector_names.py)."""
    fns = _CountingFns()
    c = Collector(max_names=1000, evict_after=100, reduce_fns=fns)
    sizes, warned, per_update = [], 0, []
    for step in range(5000):
        report(f'sample/{step}', float(step))
        if step % 10 == 9:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter('always')
                before = len(fns.calls)
                c.update()
                per_update.append(fns.calls[before:])
            warned += len(caught)
            sizes.append(len(c.names()))
            # the 10 names of this interval are published exactly
            for name in (f'sample/{step - 9}', f'sample/{step}'):
                assert c.num(name) == 1 and c.mean(name) == int(name[7:])
    assert max(sizes) <= 1000 and sizes[-1] == 1000
    assert warned == 0  # idle names leave before the bound is reached
    # the table is full of names idle for < 100 updates, no older ones
    assert c.names()[0] == 'sample/4000'
    # the same collectives every update; once the table is full (update
    # 100) the numbers they carry stop growing: a few per name in the table
    assert len({len(calls) for calls in per_update}) == 1
    numbers = [sum(calls) for calls in per_update]
    assert numbers[0] < numbers[50] < numbers[100]
    assert set(numbers[100:]) == {numbers[100]}
    assert numbers[100] <= 12 * (1000 + 10)


def test_refused_names_warn_once_per_update():
    c = Collector(max_names=3)
    for name in 'edcba':
        report(name, 1.0)
    with pytest.warns(
            UserWarning,
            match=r"2 new names refused .*"
            r"max_names=3\): 'd', 'e'") as caught:
        c.update()
    assert len(caught) == 1
    assert c.names() == ['a', 'b', 'c']


def test_a_collector_that_is_never_updated_holds_a_bounded_amount():
    from mmstats.stats.collector import MAX_CHUNKS
    idle = Collector()  # e.g. a training_stats collector nobody updates
    busy = Collector()
    for step in range(3 * MAX_CHUNKS):
        report('loss', float(step))
        report(f'name{step % 7}', [1.0, 2.0])
        busy.update()  # flushes to every live collector
    assert len(idle._chunks) < MAX_CHUNKS
    idle.update()  # and nothing was lost
    assert idle.num('loss') == 3 * MAX_CHUNKS
    assert idle.mean('loss') == pytest.approx(np.mean(range(3 * MAX_CHUNKS)))
    assert idle.num('name3') == 2 * len(range(3, 3 * MAX_CHUNKS, 7))


def test_the_regex_cache_stays_bounded():
    collector = Collector(regex='keep.*', max_names=10)
    for step in range(30):
        for i in range(10):
            report(f'n{step}_{i}', 1.0)
        collector.update()
    assert len(collector._matches) <= 4 * 10


@pytest.mark.parametrize('bad', [float('inf'), -float('inf')])
def test_a_large_tensor_with_inf_and_no_nan(bad):
    """report() of more than LARGE_NUMEL values (reduced at once) holding
    an infinity but no NaN: counted as non-finite, out of the moments."""
    from mmstats.stats.pending import LARGE_NUMEL
    c = Collector('x')
    x = torch.arange(LARGE_NUMEL + 10, dtype=torch.float32)
    x[7] = bad
    report('x', x)
    c.update()
    finite = np.delete(x.double().numpy(), 7)
    assert c.num('x') == finite.size and c.nonfinite('x') == 1
    assert c.mean('x') == pytest.approx(finite.mean(), rel=1e-12)
    assert (c.min('x'), c.max('x')) == (finite.min(), finite.max())


def _python_calls_of_an_update(num_names: int) -> int:
    """Python function calls (generator steps included) of one steady-state
    ``update()`` of ``num_names`` names with one float each. The cyclic
    garbage collector is off while it is counted: a collection would run
    the finalizers of whatever earlier tests of the process left in
    cycles, counted as the update's calls."""
    collector = Collector()
    names = [f'stat/{i}' for i in range(num_names)]
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event in ('call', 'c_call')

    for step in range(3):  # the table settles first
        for name in names:
            report(name, float(step))
        if step == 2:
            gc.collect()
            gc.disable()
            sys.setprofile(count)
        try:
            collector.update()
        finally:
            sys.setprofile(None)
            if step == 2:
                gc.enable()
    assert collector.num(names[-1]) == 1
    return calls


def test_update_host_work_per_name_is_flat():
    """The host work of an update grows by a constant per name (a few
    generator steps), not more: the same per-name count from 10 to 1000
    names (the time per name is in tools/benchmarks/collector.py)."""
    calls = {n: _python_calls_of_an_update(n) for n in (10, 100, 1000)}
    per_name_small = (calls[100] - calls[10]) / 90
    per_name_large = (calls[1000] - calls[100]) / 900
    assert per_name_small == per_name_large <= 4
