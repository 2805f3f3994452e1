"""StatsCollectorHook's spikes and all-rank histograms in real mmengine
Runners (1 and 2 gloo processes). Spikes are planted into one rank's loss
at a chosen iteration; which publications spike, their values and the rank
named are recomputed from every rank's raw losses. Histograms are read
back from TensorBoard's event file and from an offline W&B run's file
(``tests/helpers/wandb_records.py``) and recomputed from every rank's raw
reported values."""
import os.path as osp
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.runner import Runner

from mmstats import report
from mmstats.health import SpikeError
from mmstats.stats.sketch import DEFAULT_BUCKETS
from mmstats.utils.torch_compat import torch_at_least
from tests.helpers.dist import run_distributed
from tests.helpers.logs import mmengine_logs, warnings_logged
from tests.helpers.runner import gloo_launch, read_scalars, toy_cfg

MAX_ITERS, LOG_INTERVAL = 24, 2
STEPS = list(range(LOG_INTERVAL, MAX_ITERS + 1, LOG_INTERVAL))
SPIKE_AT = 15  # runner.iter of the planted spike: published at step 16
FACTOR, WINDOW = 4., 20  # the hook's defaults


def on_edges(rank, iteration):
    """16 values on histogram bucket edges or one ulp beside them: -1, 1
    and an edge ``E[k]`` chosen by rank and iteration (0.0025 to 380), each
    of both signs, and -2, 0.5, 2, 3."""
    k = (37 * iteration + 101 * rank) % 600 - 300
    edge = DEFAULT_BUCKETS.edges[0, k - DEFAULT_BUCKETS.min_key + 1]
    v = np.array([1., edge])
    v = np.concatenate([v, np.nextafter(v, 0.), np.nextafter(v, np.inf)])
    return np.concatenate([v, -v, [-2., 0.5, 2., 3.]])


@ROOT_HOOKS.register_module(force=True)
class PlantHook(Hook):
    """Keep every loss of this rank (times ``scale`` at ``spike_at`` on
    ``spike_rank``) and, with ``spread``, report and keep 48 values under
    ``spread``: 32 of wide magnitudes, both signs and zeros, and 16 on
    bucket edges (:func:`on_edges`)."""
    priority = 'ABOVE_NORMAL'  # before StatsCollectorHook reports outputs

    def __init__(self,
                 spike_at=None,
                 spike_rank=0,
                 scale=100.,
                 spread=False,
                 spread_iters=(0, MAX_ITERS)):
        self.spike_at, self.spike_rank = spike_at, spike_rank
        self.scale = scale
        self.spread, self.spread_iters = spread, spread_iters
        self.losses, self.spreads = [], []

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        from mmengine.dist import get_rank
        rank = get_rank()
        if runner.iter == self.spike_at and rank == self.spike_rank:
            outputs['loss'] = outputs['loss'] * self.scale
        self.losses.append(float(outputs['loss'].detach()))
        if self.spread and runner.iter in range(*self.spread_iters):
            gen = torch.Generator().manual_seed(1000 * rank + runner.iter)
            x = torch.randn(32, generator=gen, dtype=torch.float64)
            x *= 10.**torch.randint(-3, 4, (32, ), generator=gen)
            x[::8] = 0.
            x = torch.cat([x, torch.from_numpy(on_edges(rank, runner.iter))])
            self.spreads.append(x.numpy().copy())
            report('spread', x)


def _stats_hook(runner):
    from mmstats.hooks import StatsCollectorHook
    return [h for h in runner.hooks if isinstance(h, StatsCollectorHook)][0]


def _plant(runner) -> PlantHook:
    return [h for h in runner.hooks if isinstance(h, PlantHook)][0]


def _count_publication_work(runner) -> dict:
    """Count the calls of the hook's spike check and histogram writing
    (they must run at publications only)."""
    hook = _stats_hook(runner)
    counts = dict(_check_spikes=0, _write_histograms=0)
    for name in counts:
        method = getattr(hook, name)

        def counted(*args, _method=method, _name=name, **kwargs):
            counts[_name] += 1
            return _method(*args, **kwargs)

        setattr(hook, name, counted)
    return counts


def _train(work_dir,
           distributed=False,
           plant=None,
           hook=None,
           vis=None,
           max_iters=MAX_ITERS):
    cfg = toy_cfg(
        work_dir,
        by_epoch=False,
        max_iters=max_iters,
        log_interval=LOG_INTERVAL)
    if distributed:
        cfg = gloo_launch(cfg)
    if vis is not None:
        cfg.visualizer = dict(type='Visualizer', vis_backends=vis)
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook', **(hook or {})),
        dict(type='PlantHook', **(plant or {}))
    ]
    return Runner.from_cfg(cfg)


def expected_spikes(losses, factor=FACTOR, window=WINDOW):
    """``{step: (max, median)}`` of the publications whose all-rank loss
    maximum exceeds ``factor`` x the median of the previous (at most
    ``window``, at least 5) maxima; ``losses`` is ``(ranks, iterations)``."""
    maxima = [losses[:, s - LOG_INTERVAL:s].max() for s in STEPS]
    out = {}
    for i, (step, value) in enumerate(zip(STEPS, maxima)):
        history = np.abs(maxima[max(0, i - window):i])
        if len(history) >= 5 and abs(value) > factor * np.median(history):
            out[step] = (value, float(np.median(history)))
    return out


# the message leads with what spiked, how much and on which rank
SPIKE_LINE = re.compile(
    r'StatsCollectorHook: spike in loss: max (\S+) is (\S+)x the median '
    r'(\S+) of its last (\d+) publications, largest value from rank (\d) '
    r'at iteration (\d+) ')


def _spikes_logged(text):
    return [
        m.groups()[-1:] + m.groups()[:-1] for m in SPIKE_LINE.finditer(text)
    ]


def _check_spike_lines(lines, losses, rank):
    expected = expected_spikes(losses)
    assert list(expected) == [SPIKE_AT + 1]  # the planted one, only
    (value, median), = expected.values()
    (step, got, ratio, got_median, count, got_rank), = lines
    assert int(step) == SPIKE_AT + 1 and int(got_rank) == rank
    assert int(count) == SPIKE_AT // LOG_INTERVAL  # every earlier one
    assert float(got) == pytest.approx(value, rel=1e-5)
    assert float(got_median) == pytest.approx(median, rel=1e-5)
    assert float(ratio) == pytest.approx(value / median, rel=1e-2)


# -- spikes: 1 process ------------------------------------------------------
def test_planted_spike_warns_once_with_its_iteration_and_rank(
        tmp_path, clean_mmengine, caplog):
    runner = _train(tmp_path, plant=dict(spike_at=SPIKE_AT))
    with mmengine_logs(caplog):
        runner.train()
    losses = np.array([_plant(runner).losses])
    warned = [w for w in warnings_logged(caplog) if 'spike' in w]
    assert len(warned) == 1
    _check_spike_lines(_spikes_logged(warned[0]), losses, rank=0)
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert log.count('StatsCollectorHook: spike in') == 1


def test_healthy_run_never_spikes(tmp_path, clean_mmengine, caplog):
    runner = _train(tmp_path)
    calls = _count_publication_work(runner)
    with mmengine_logs(caplog):
        runner.train()
    # at every publication (and the validation's, at the end), only there
    assert calls == dict(_check_spikes=len(STEPS) + 1, _write_histograms=0)
    assert expected_spikes(np.array([_plant(runner).losses])) == {}
    assert not [w for w in warnings_logged(caplog) if 'spike' in w]
    hook = _stats_hook(runner)
    assert len(hook.health.detector.history('loss')) == len(STEPS)  # watched


def test_spike_of_the_mean_and_a_smaller_factor(tmp_path, clean_mmengine,
                                                caplog):
    """spike_stat='mean', spike_factor=1.5, spike_window=4 reach the
    detector: the interval means are recomputed."""
    runner = _train(
        tmp_path,
        plant=dict(spike_at=SPIKE_AT, scale=5.),
        hook=dict(
            health=dict(spike_stat='mean', spike_factor=1.5, spike_window=4)))
    with mmengine_logs(caplog):
        runner.train()
    losses = np.array(_plant(runner).losses)
    means = [losses[s - LOG_INTERVAL:s].mean() for s in STEPS]
    expected = [
        step for i, step in enumerate(STEPS)
        if i >= 4 and means[i] > 1.5 * np.median(means[i - 4:i])
    ]
    warned = [w for w in warnings_logged(caplog) if 'spike' in w]
    assert expected and SPIKE_AT + 1 in expected
    assert [int(re.search(r'iteration (\d+)', w).group(1))
            for w in warned] == expected
    for w in warned:
        assert 'loss: mean ' in w and 'last 4 publications' in w


# -- spikes: 2 processes ----------------------------------------------------
def _count_calls(obj, names, counts):
    for name in names:
        original = getattr(obj, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _original(*args, **kwargs)

        setattr(obj, name, counted)


def _spike_rank(rank, world, work_dir, plant, hook):
    from mmstats.stats.protocol import ReduceFns
    counts = {}
    originals = {
        n: getattr(ReduceFns, n)
        for n in ('all_reduce_max', 'all_reduce_sum', 'all_gather',
                  'all_gather_object')
    }
    _count_calls(ReduceFns, originals, counts)
    try:
        runner = _train(work_dir, True, plant, hook)
        raised = None
        try:
            runner.train()
        except SpikeError as e:
            raised = str(e)
    finally:
        for name, fn in originals.items():
            setattr(ReduceFns, name, fn)
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    return dict(
        losses=_plant(runner).losses,
        log=log,
        raised=raised,
        iter=runner.iter,
        counts=counts,
        scalars=read_scalars(runner) if rank == 0 else None)


def test_two_ranks_name_the_rank_of_the_spike_one_collective_more(tmp_path):
    planted = run_distributed(
        _spike_rank,
        2,
        str(tmp_path / 'a'),
        dict(spike_at=SPIKE_AT, spike_rank=1), {},
        timeout=240)
    losses = np.array([r['losses'] for r in planted])
    assert not np.allclose(losses[0], losses[1])  # ranks really differ
    # rank 0 writes the log file; both ranks warned the same (stdout)
    _check_spike_lines(_spikes_logged(planted[0]['log']), losses, rank=1)
    off = run_distributed(
        _spike_rank,
        2,
        str(tmp_path / 'b'),
        dict(spike_at=SPIKE_AT, spike_rank=1),
        dict(health=dict(spike_regex=None)),
        timeout=240)
    assert not _spikes_logged(off[0]['log'])
    for on, without in zip(planted, off):
        more = dict(on['counts'])
        more['all_reduce_max'] -= 1  # largest_ranks, once
        assert more == without['counts']


def test_two_ranks_raise_on_every_rank_at_the_same_iteration(tmp_path):
    results = run_distributed(
        _spike_rank,
        2,
        str(tmp_path),
        dict(spike_at=SPIKE_AT, spike_rank=0),
        dict(health=dict(on_spike='raise')),
        timeout=240)
    for result in results:
        assert result['iter'] == SPIKE_AT  # stopped in that iteration
        lines = _spikes_logged(result['raised'])
        assert lines and lines[0][0] == str(SPIKE_AT + 1)
        assert lines[0][-1] == '0'
    assert results[0]['raised'] == results[1]['raised']
    losses = np.array([r['losses'] for r in results])
    # the spiking publication was written before the raise
    record = results[0]['scalars'][SPIKE_AT + 1]
    assert record['stats/loss/max'] == pytest.approx(
        losses[:, SPIKE_AT + 1 - LOG_INTERVAL:].max(), rel=1e-6)


# -- histograms -------------------------------------------------------------
HIST_HOOK = dict(
    stats=('mean', 'max', 'p50'), health=dict(histogram_regex='spread|loss'))
TAG = 'stats/spread/hist'


def _histograms(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import (
        HISTOGRAMS, EventAccumulator)
    events = EventAccumulator(
        osp.join(log_dir, 'vis_data'), size_guidance={
            HISTOGRAMS: 0
        }).Reload()
    return {
        tag: {
            e.step: e.histogram_value
            for e in events.Histograms(tag)
        }
        for tag in events.Tags()['histograms']
    }


def _check_buckets(low, limits, counts, raw, max_buckets):
    """Buckets ``(limits[i - 1], limits[i]]`` (the first from ``low`` on)
    holding ``counts`` against the raw (finite) values: each counted once,
    in its bucket, the edges the exact minimum and maximum."""
    assert (low, limits[-1]) == (raw.min(), raw.max())
    assert 0 < len(limits) == len(counts) <= max_buckets
    assert (np.diff(limits) > 0).all() and counts.sum() == raw.size
    np.testing.assert_array_equal(
        counts,
        np.bincount(
            np.searchsorted(limits, raw, side='left'), minlength=len(limits)))
    if max_buckets >= 512:  # the sketch's resolution: 1% buckets
        lower = np.concatenate([[low], limits[:-1]])
        full = (counts > 0) & (lower > 0)
        assert (limits[full] / lower[full]
                <= DEFAULT_BUCKETS.gamma * (1 + 1e-12)).all()
        assert (counts > 0).sum() > 50  # wide magnitudes: many buckets


def _check_histogram(hist, raw, max_buckets):
    """``hist`` (a TensorBoard HistogramValue) against the raw values."""
    assert hist.num == raw.size
    assert (hist.min, hist.max) == (raw.min(), raw.max())
    assert hist.sum == pytest.approx(raw.sum(), rel=1e-9, abs=1e-9)
    assert hist.sum_squares == pytest.approx((raw * raw).sum(), rel=1e-9)
    _check_buckets(hist.min, np.array(hist.bucket_limit),
                   np.array(hist.bucket), raw, max_buckets)


def _check_histograms(histograms, spreads, losses, max_buckets=512):
    """spreads: (ranks, iters, 32); losses: (ranks, iters)."""
    assert sorted(histograms) == ['stats/loss/hist', TAG]
    assert sorted(histograms[TAG]) == STEPS
    for step in STEPS:
        window = slice(step - LOG_INTERVAL, step)
        _check_histogram(histograms[TAG][step], spreads[:, window].ravel(),
                         max_buckets)
        loss = histograms['stats/loss/hist'][step]
        assert loss.num == losses[:, window].size
        assert loss.max == pytest.approx(losses[:, window].max(), rel=1e-6)


@pytest.mark.parametrize('max_buckets', [512, 8])
def test_tensorboard_histograms_of_every_publication(tmp_path, clean_mmengine,
                                                     max_buckets):
    pytest.importorskip('tensorboard')
    runner = _train(
        tmp_path,
        plant=dict(spread=True),
        hook=dict(
            HIST_HOOK,
            health=dict(HIST_HOOK['health'], histogram_buckets=max_buckets)),
        vis=[dict(type='TensorboardVisBackend')])
    calls = _count_publication_work(runner)
    runner.train()
    runner.visualizer.close()
    # publications only (the last one: validation's)
    assert calls['_write_histograms'] == len(STEPS) + 1
    plant = _plant(runner)
    _check_histograms(
        _histograms(runner.log_dir), np.array([plant.spreads]),
        np.array([plant.losses]), max_buckets)


def test_names_without_new_values_get_no_histogram_and_no_spike_check(
        tmp_path, clean_mmengine):
    """keep_previous=True re-publishes a name's previous statistics when it
    got no values: neither a histogram nor the spike history takes them."""
    pytest.importorskip('tensorboard')
    runner = _train(
        tmp_path,
        plant=dict(spread=True, spread_iters=(16, 20)),
        hook=dict(
            HIST_HOOK,
            keep_previous=True,
            health=dict(HIST_HOOK['health'], spike_regex='spread|loss')),
        vis=[dict(type='LocalVisBackend'),
             dict(type='TensorboardVisBackend')])
    runner.train()
    runner.visualizer.close()
    spreads = np.array(_plant(runner).spreads)  # iterations 17-20
    scalars = read_scalars(runner)
    # re-published at 22 and 24 (keep_previous), without a histogram
    assert scalars[24]['stats/spread/max'] == spreads[2:].max()
    histograms = _histograms(runner.log_dir)
    assert sorted(histograms[TAG]) == [18, 20]
    for i, step in enumerate([18, 20]):
        _check_histogram(histograms[TAG][step],
                         spreads[2 * i:2 * i + 2].ravel(), 512)
    assert sorted(histograms['stats/loss/hist']) == STEPS
    hook = _stats_hook(runner)
    assert hook.health.detector.history('spread') == [
        spreads[:2].max(), spreads[2:].max()
    ]
    assert len(hook.health.detector.history('loss')) == len(STEPS)


def _hist_rank(rank, world, work_dir):
    runner = _train(
        work_dir,
        True,
        dict(spread=True),
        HIST_HOOK,
        vis=[dict(type='TensorboardVisBackend')])
    runner.train()
    runner.visualizer.close()
    plant = _plant(runner)
    return dict(
        spreads=np.array(plant.spreads),
        losses=plant.losses,
        histograms=_histograms(runner.log_dir) if rank == 0 else None)


def test_two_ranks_tensorboard_histograms_merge_every_rank(tmp_path):
    pytest.importorskip('tensorboard')
    results = run_distributed(_hist_rank, 2, str(tmp_path), timeout=240)
    spreads = np.stack([r['spreads'] for r in results])
    assert not np.allclose(spreads[0], spreads[1])
    _check_histograms(results[0]['histograms'], spreads,
                      np.array([r['losses'] for r in results]))


def _offline_wandb(monkeypatch, tmp_path):
    """W&B offline and silent, kept inside ``tmp_path``: its runs, its cache
    (wandb-core's logs), config (no settings file, no login), data and
    artifact dirs, no ``~/.netrc`` (``NETRC``), and the working dir
    (``WandbVisBackend.add_config`` logs the ``.py`` files under it as
    code) and Python's temporary files (``tempfile.tempdir``: the dirs
    wandb makes when imported and removes at exit, which a pooled rank
    leaving with ``os._exit`` skips; wandb-core's port file); no console
    capture, system metrics or git calls. wandb-core's sockets stay in the
    system's temp dir (removed when it stops)."""
    for var in ('WANDB_API_KEY', 'WANDB_BASE_URL', 'WANDB_ENTITY',
                'WANDB_RUN_ID', 'WANDB_RESUME'):
        monkeypatch.delenv(var, raising=False)
    switches = dict(
        MODE='offline',
        SILENT='true',
        CONSOLE='off',
        _DISABLE_STATS='true',
        DISABLE_GIT='true')
    for var, value in switches.items():
        monkeypatch.setenv(f'WANDB_{var}', value)
    monkeypatch.setenv('WANDB_DIR', str(tmp_path))
    for var in ('CACHE', 'CONFIG', 'DATA', 'ARTIFACT'):
        monkeypatch.setenv(f'WANDB_{var}_DIR', str(tmp_path / var.lower()))
    monkeypatch.setenv('NETRC', str(tmp_path / 'no.netrc'))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))


def _check_wandb_histogram(hist, raw, max_buckets=512):
    """``hist`` (W&B's ``{'_type': 'histogram', 'values', 'bins'}``)
    against the raw values."""
    assert hist['_type'] == 'histogram' and len(hist) == 3
    bins, values = np.array(hist['bins']), np.array(hist['values'])
    assert len(bins) == len(values) + 1
    _check_buckets(bins[0], bins[1:], values, raw, max_buckets)


WANDB_ITERS = 2 * LOG_INTERVAL  # two publications


def _wandb_train(tmp_path, monkeypatch, distributed=False):
    """Train ``WANDB_ITERS`` iterations with an offline W&B run in
    ``tmp_path`` (mmengine's WandbVisBackend, rank 0's), closed (W&B's
    ``finish``). Returns the runner and, on rank 0, the run's history."""
    from mmengine.dist import is_main_process

    from tests.helpers.wandb_records import history
    _offline_wandb(monkeypatch, tmp_path)
    runner = _train(
        tmp_path / 'work',
        distributed,
        plant=dict(spread=True),
        hook=HIST_HOOK,
        vis=[
            dict(
                type='WandbVisBackend',
                init_kwargs=dict(
                    mode='offline', dir=str(tmp_path), project='mmstats-test'))
        ],
        max_iters=WANDB_ITERS)
    if not is_main_process():  # no W&B run on the other ranks
        runner.train()
        return runner, None
    import wandb
    try:
        runner.train()
    finally:
        runner.visualizer.close()  # WandbVisBackend.close: wandb.finish
        wandb.teardown()  # wandb-core stopped
    return runner, history(str(tmp_path))


def _check_wandb_steps(steps, spreads, losses):
    """The W&B history ``steps`` against every rank's raw values (spreads:
    (ranks, iters, 32); losses: (ranks, iters)): at each publication, its
    histograms in the same step as its scalars."""
    assert [s['_step'] for s in steps] == list(range(len(steps)))
    published = [s for s in steps if 'stats/spread/mean' in s]
    assert [s for s in steps if TAG in s] == published  # joined
    assert [s for s in steps if 'stats/loss/hist' in s] == published
    assert len(published) == WANDB_ITERS // LOG_INTERVAL
    for i, step in enumerate(published):
        window = slice(i * LOG_INTERVAL, (i + 1) * LOG_INTERVAL)
        spread, loss = spreads[:, window].ravel(), losses[:, window]
        # this publication's scalars...
        assert step['stats/spread/max'] == spread.max()
        assert step['stats/spread/mean'] == pytest.approx(
            spread.mean(), rel=1e-9)
        assert step['stats/loss/max'] == pytest.approx(loss.max(), rel=1e-6)
        # ... and its histograms
        _check_wandb_histogram(step[TAG], spread)
        hist = step['stats/loss/hist']
        assert sum(hist['values']) == loss.size
        assert hist['bins'][-1] == pytest.approx(loss.max(), rel=1e-6)


def test_wandb_histograms_of_every_publication_join_their_scalars(
        tmp_path, clean_mmengine, monkeypatch):
    """A real offline W&B run, read back from its run file: at each
    publication, the histograms (recomputed from the raw values) in the
    same W&B step as that publication's scalars."""
    pytest.importorskip('wandb', reason='pip install wandb (tests extra)')
    runner, steps = _wandb_train(tmp_path, monkeypatch)
    plant = _plant(runner)
    _check_wandb_steps(steps, np.array([plant.spreads]),
                       np.array([plant.losses]))


def _wandb_rank(rank, world, work_dir):
    with pytest.MonkeyPatch.context() as monkeypatch:
        runner, steps = _wandb_train(Path(work_dir), monkeypatch, True)
    plant = _plant(runner)
    return dict(
        spreads=np.array(plant.spreads), losses=plant.losses, steps=steps)


def test_two_ranks_wandb_histograms_merge_every_rank(tmp_path):
    """One W&B run (rank 0's) gets both ranks' values; rank 1 starts none
    (the histogram writers are rank 0's: W&B's ``experiment`` would start a
    run on first use)."""
    pytest.importorskip('wandb', reason='pip install wandb (tests extra)')
    from tests.helpers.wandb_records import run_file
    results = run_distributed(_wandb_rank, 2, str(tmp_path), timeout=240)
    run_file(str(tmp_path))  # one W&B run: rank 1 started none
    spreads = np.stack([r['spreads'] for r in results])
    assert not np.allclose(spreads[0], spreads[1])
    _check_wandb_steps(results[0]['steps'], spreads,
                       np.array([r['losses'] for r in results]))


def test_real_wandb_accepts_the_histogram():
    wandb = pytest.importorskip(
        'wandb', reason='pip install wandb (tests extra)')
    from mmstats.health.histograms import numpy_histogram, sketch_histogram
    from mmstats.stats.sketch import bucket_counts
    x = torch.randn(10000, dtype=torch.float64) * 1e3
    hist = sketch_histogram(
        bucket_counts(x), x.numel(), float(x.mean()),
        float(x.std(correction=0)), float(x.min()), float(x.max()))
    assert len(hist.bucket_counts) <= 512
    wandb.Histogram(np_histogram=numpy_histogram(hist))


# -- configuration ----------------------------------------------------------
def test_histograms_without_a_writer_warn_at_before_run(
        tmp_path, clean_mmengine, caplog):
    runner = _train(
        tmp_path,
        hook=dict(
            HIST_HOOK, health=dict(HIST_HOOK['health'], spike_regex=None)))
    with mmengine_logs(caplog):
        runner.call_hook('before_run')
    warned = warnings_logged(caplog)
    assert len(warned) == 1
    assert 'no TensorboardVisBackend or WandbVisBackend' in warned[0]


@pytest.mark.parametrize('args, error, text', [
    (dict(health=dict(histogram_regex='loss')), ValueError,
     "needs quantile sketches, which only a quantile in stats switches on: "
     "add one, e.g. stats=('mean', 'std', 'min', 'max', 'p50')"),
    (dict(health=dict(spike_factor=1.)), ValueError,
     'spike_factor must be a finite'),
    (dict(health=dict(spike_factor='4')), TypeError, 'spike_factor must be'),
    (dict(health=dict(spike_window=0)), ValueError,
     'spike_window must be a positive'),
    (dict(health=dict(on_spike='ignore')), ValueError,
     "on_spike must be one of"),
    (dict(health=dict(spike_stat='p99')), ValueError,
     'spike_stat must be one of'),
    (dict(health=dict(spike_regex='loss(')), ValueError, 'spike_regex'),
    (dict(health=dict(histogram_regex='('),
          stats=('mean', 'p50')), ValueError, 'histogram_regex'),
    (dict(health=dict(histogram_buckets=0), stats=('mean', 'p50')), ValueError,
     'histogram_buckets must be a positive int'),
])
def test_config_mistakes_fail_when_the_hook_is_built(args, error, text):
    from mmstats.hooks import StatsCollectorHook
    with pytest.raises(error, match=re.escape(text)):
        StatsCollectorHook(**args)


def test_switched_off_nothing_is_kept():
    from mmstats.hooks import StatsCollectorHook
    hook = StatsCollectorHook(health=dict(spike_regex=None))
    assert hook.health.detector is None and not hook.health.writes_histograms
    assert hook._hist_writers == []


def test_spike_history_is_saved_and_resumed(tmp_path, clean_mmengine):
    """A checkpoint holds the spike detector's histories; a resumed run
    starts from them (not from an empty history that cannot spike)."""
    from mmstats.launch import allow_mmengine_checkpoints
    allow_mmengine_checkpoints()
    hook = dict(
        type='mmstats.StatsCollectorHook',
        interval=1,
        health=dict(spike_regex='loss', spike_window=4))
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        max_iters=6,
        log_interval=1,
        custom_hooks=[hook])
    cfg.default_hooks.checkpoint.interval = 6
    runner = Runner.from_cfg(cfg)
    runner.train()
    saved = torch.load(
        str(tmp_path / 'iter_6.pth'),  # the allowlist is filled from 2.6 on
        weights_only=torch_at_least('2.6'))['meta']['mmstats_spike_history']
    losses = [
        r['stats/loss/max'] for r in read_scalars(runner).values()
        if 'stats/loss/max' in r
    ]
    assert saved == {'loss': losses[-4:]}
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        max_iters=7,
        log_interval=1,
        custom_hooks=[hook],
        resume=True)
    resumed = Runner.from_cfg(cfg)
    seen = []
    stats = _stats_hook(resumed)
    before_train = stats.before_train

    def check(runner):
        seen.append(stats.health.detector.history('loss'))
        before_train(runner)

    stats.before_train = check
    resumed.train()
    assert seen == [losses[-4:]]
