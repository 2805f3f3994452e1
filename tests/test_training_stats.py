"""The StyleGAN3/EDM2 drop-in, used the way their training loops use it."""
import importlib
import json
import math

import numpy as np
import pytest
import torch

from mmstats.stats import reset

TIMEOUT = 90


@pytest.fixture
def ts():
    """A fresh ``mmstats.training_stats`` (its own default_collector) and
    no pending value from other tests."""
    import mmstats.training_stats as module
    reset()
    module = importlib.reload(module)
    yield module
    module.default_collector = None
    reset()


def expected(values):
    """num, mean and population std of the finite values, numpy float64."""
    x = np.concatenate(
        [np.asarray(v, dtype=np.float64).ravel() for v in values])
    x = x[np.isfinite(x)]
    if not x.size:
        return dict(num=0, mean=math.nan, std=math.nan)
    return dict(num=int(x.size), mean=float(x.mean()), std=float(x.std()))


def assert_stat(got, values):
    want = expected(values)
    assert got['num'] == want['num'] and isinstance(got['num'], int)
    for key in ('mean', 'std'):
        if math.isnan(want[key]):
            assert math.isnan(got[key]), (key, got)
        else:
            assert math.isclose(
                got[key], want[key], rel_tol=1e-12,
                abs_tol=1e-15), (key, got[key], want[key])


def stylegan3_tick(ts, collector, rng, tick, jsonl):
    """One tick of StyleGAN3's loop: loss reports (tensors as in loss.py),
    Timing/Progress with report0, update, as_dict, a stats.jsonl line."""
    raw = {'Loss/scores/real': [], 'Loss/G/loss': []}
    for _ in range(3):
        scores = torch.from_numpy(rng.normal(5., 2., (8, 1)))
        loss = torch.from_numpy(rng.lognormal(0., 1., (8, 1))).float()
        assert ts.report('Loss/scores/real', scores) is scores
        ts.report('Loss/G/loss', loss)
        raw['Loss/scores/real'].append(scores.numpy())
        raw['Loss/G/loss'].append(loss.numpy())
    fields = [f"tick {ts.report0('Progress/tick', tick):<5d}"]
    raw['Progress/tick'] = [tick]
    raw['Timing/sec_per_tick'] = [ts.report0('Timing/sec_per_tick', 0.25)]
    # a phase without CUDA events reports [] (the name, no value)
    raw['Timing/Gphase'] = [ts.report0('Timing/Gphase', [])]
    assert fields == [f'tick {tick:<5d}']
    collector.update()
    stats_dict = collector.as_dict()
    jsonl.append(json.dumps(dict(stats_dict, timestamp=123.5)))
    return raw, stats_dict


def test_stylegan3_training_loop_pattern(ts):
    collector = ts.Collector(regex='.*')
    ts.init_multiprocessing(rank=0, sync_device=None)
    rng = np.random.default_rng(0)
    jsonl = []
    for tick in range(2):
        raw, stats_dict = stylegan3_tick(ts, collector, rng, tick, jsonl)
        assert collector.names() == sorted(raw)
        fields = json.loads(jsonl[-1])
        assert fields.pop('timestamp') == 123.5
        assert set(fields) == set(raw)
        for name, values in raw.items():
            assert_stat(fields[name], values)
            # the tensorboard loop: value.mean by attribute
            stat = stats_dict[name]
            np.testing.assert_equal([stat.num, stat.mean, stat.mean, stat.std],
                                    [
                                        collector.num(name), collector[name],
                                        collector.mean(name),
                                        collector.std(name)
                                    ])
    with pytest.raises(AttributeError):
        stats_dict.missing


def test_edm2_default_collector_jsonl(ts):
    """EDM2's status block: default_collector (keep_previous=False) and a
    hand-formatted JSON line with 'NaN' for names without values."""
    assert ts.default_collector._keep_previous is False
    ts.report('Loss/loss', torch.tensor([[1., 2.], [4., float('nan')]]))
    ts.report('Loss/learning_rate', 0.01)
    ts.report0('Progress/kimg', 0.5)
    ts.default_collector.update()
    ts.report('Loss/loss', torch.tensor([3.]))
    ts.default_collector.update()  # no learning rate this time
    fmt = {'Progress/kimg': '%.3f', 'timestamp': '%.3f'}
    items = [(name, value.mean)
             for name, value in ts.default_collector.as_dict().items()
             ] + [('timestamp', 7.)]
    items = [
        f'"{name}": ' +
        (fmt.get(name, '%g') % value if np.isfinite(value) else 'NaN')
        for name, value in items
    ]
    line = '{' + ', '.join(items) + '}'
    assert line == ('{"Loss/learning_rate": NaN, "Loss/loss": 3, '
                    '"Progress/kimg": NaN, "timestamp": 7.000}')


def test_nonfinite_ignored_like_edm2(ts):
    collector = ts.Collector()
    values = np.array([1., np.nan, 3., np.inf, -np.inf])
    ts.report('x', values)
    ts.report('only_nan', [float('nan')])
    collector.update()
    assert_stat(collector.as_dict()['x'], [values])
    assert collector.nonfinite('x') == 3
    assert collector.num('only_nan') == 0 and math.isnan(
        collector.mean('only_nan'))


@pytest.mark.parametrize('keep_previous', [True, False])
def test_keep_previous(ts, keep_previous):
    collector = ts.Collector(regex='a|b', keep_previous=keep_previous)
    ts.report('a', [1., 2.])
    ts.report('b', 5)
    ts.report('c', 9.)  # not matched by the regex
    collector.update()
    assert collector.names() == ['a', 'b']
    ts.report('b', [7., 9.])
    ts.report('a', [float('nan')])  # no finite value: like no value
    collector.update()
    assert_stat(collector.as_dict()['b'], [[7., 9.]])
    if keep_previous:
        assert_stat(collector.as_dict()['a'], [[1., 2.]])
    else:
        assert_stat(collector.as_dict()['a'], [[]])
    assert collector.num('never') == 0 and math.isnan(collector['never'])


def test_std_is_population_std(ts):
    collector = ts.Collector()
    ts.report('one', 4.)
    ts.report('two', [1., 3.])
    collector.update()
    assert collector.std('one') == 0.
    assert collector.std('two') == 1.  # ddof=0: sqrt(((1-2)^2+(3-2)^2)/2)


# -- two gloo ranks ------------------------------------------------------


def _rank_values(rank):
    rng = np.random.default_rng(100 + rank)
    return {
        'Loss/G/loss': [rng.lognormal(0., 2., 16) for _ in range(3)],
        # each rank has a name of its own, reported in its own order
        f'Loss/rank{rank}': [rng.normal(size=4)],
    }


def _worker_loop(rank, world_size):
    from mmstats import training_stats as ts
    ts.init_multiprocessing(rank=rank, sync_device=torch.device('cpu'))
    collector = ts.Collector(regex='.*')
    values = _rank_values(rank)
    for name in sorted(values, reverse=bool(rank)):
        for v in values[name]:
            ts.report(name, torch.from_numpy(v))
    ts.report0('Timing/total_sec', 10. + rank)
    collector.update()
    stats = collector.as_dict()
    edm2 = ts.default_collector
    edm2.update()
    return (json.dumps(dict(stats, timestamp=1.)), collector.names(),
            json.dumps(edm2.as_dict()))


def test_two_ranks_exact_and_mismatched_names():
    from tests.helpers.dist import run_distributed
    results = run_distributed(_worker_loop, 2, timeout=TIMEOUT)
    assert results[0] == results[1]  # identical on every rank
    line, names, edm2 = results[0]
    fields = json.loads(line)
    raw = {'Timing/total_sec': [[10.]]}
    for rank in range(2):
        for name, values in _rank_values(rank).items():
            raw.setdefault(name, []).extend(values)
    assert names == sorted(raw)
    assert set(fields) == set(raw) | {'timestamp'}
    for name, values in raw.items():
        assert_stat(fields[name], values)
    assert json.loads(edm2) == {k: fields[k] for k in raw}


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_values_like_stylegan3_loss(ts):
    """Losses reported as CUDA tensors (fp16 and fp32) without a sync."""
    collector = ts.Collector(regex='Loss/.*')
    rng = np.random.default_rng(7)
    raw = [rng.normal(0., 3., (16, 1)) for _ in range(4)]
    ts.report('Loss/G/loss', torch.zeros(1, device='cuda'))  # warm-up
    collector.update()
    tensors = [
        torch.from_numpy(v).to('cuda',
                               torch.float16 if i % 2 else torch.float32)
        for i, v in enumerate(raw)
    ]
    torch.cuda.set_sync_debug_mode('error')
    try:
        for tensor in tensors:
            assert ts.report('Loss/G/loss', tensor) is tensor
    finally:
        torch.cuda.set_sync_debug_mode('default')
    collector.update()
    raw = [t.double().cpu().numpy() for t in tensors]  # as reported
    assert_stat(collector.as_dict()['Loss/G/loss'], raw)
