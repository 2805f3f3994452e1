"""StatsCollectorHook(stats=('mean', 'p50', 'p99')) in real mmengine Runners
(1 and 2 gloo processes): every published quantile is checked against
numpy's lower quantile of the raw values the ranks reported."""
import json
import os.path as osp

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.runner import Runner

from mmstats import report
from tests.helpers.dist import run_distributed
from tests.helpers.runner import gloo_launch, toy_cfg
from tests.test_hooks.test_stats_collector_runner import BatchIdsHook
from tests.test_stats.test_sketch import ALPHA, assert_within_alpha

LOG_INTERVAL, MAX_ITERS = 5, 10
STATS = ('mean', 'p50', 'p99')
# 'spread' = loss times these: 7 values per iteration over 6 decades
SCALES = 10.**np.arange(-3, 4)


@ROOT_HOOKS.register_module(force=True)
class SpreadRecorderHook(Hook):
    """Keep each iteration's loss; report (and keep) it times SCALES."""
    priority = 'ABOVE_NORMAL'  # before StatsCollectorHook publishes

    def __init__(self):
        self.losses, self.spreads = [], []

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        loss = outputs['loss'].detach()
        self.losses.append(float(loss))
        spread = loss.double() * torch.from_numpy(SCALES)
        self.spreads.append(spread.numpy().copy())
        report('spread', spread)


def _train(work_dir, distributed=False):
    cfg = toy_cfg(
        work_dir,
        by_epoch=False,
        max_iters=MAX_ITERS,
        log_interval=LOG_INTERVAL)
    if distributed:
        cfg = gloo_launch(cfg)
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook', stats=STATS),
        dict(type='SpreadRecorderHook')
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    rec = [h for h in runner.hooks if isinstance(h, SpreadRecorderHook)][0]
    assert all(c._sketch for c in _hook(runner).collectors.values())
    return dict(
        losses=rec.losses,
        spreads=np.stack(rec.spreads),
        scalars=_read_scalars(runner.log_dir))


def _hook(runner):
    return [h for h in runner.hooks if hasattr(h, 'collectors')][0]


def _read_scalars(log_dir):
    path = osp.join(log_dir, 'vis_data', 'scalars.json')
    if not osp.exists(path):  # only rank 0 writes it
        return None
    merged = {}
    for line in open(path):
        record = json.loads(line)
        merged.setdefault(record['step'], {}).update(record)
    return merged


def _check(scalars, losses, spreads):
    """losses: (ranks, iters); spreads: (ranks, iters, len(SCALES))."""
    steps = sorted(s for s, r in scalars.items() if 'stats/loss/p50' in r)
    assert steps == list(range(LOG_INTERVAL, MAX_ITERS + 1, LOG_INTERVAL))
    start = 0
    for step in steps:
        record = scalars[step]
        for name, raw in (('loss', losses), ('spread', spreads)):
            window = raw[:, start:step].reshape(-1).astype(np.float64)
            np.testing.assert_allclose(
                record[f'stats/{name}/mean'], window.mean(), rtol=1e-6)
            for stat, q in (('p50', 0.5), ('p99', 0.99)):
                true = np.quantile(window, q, method='lower')
                got = record[f'stats/{name}/{stat}']
                # scalars.json holds float32-rounded values of the losses
                assert_within_alpha(
                    np.array([got]), np.array([true]), ALPHA + 1e-6)
        assert 'stats/loss/std' not in record  # only what stats asks
        start = step


def test_real_runner_quantiles(tmp_path, clean_mmengine):
    out = _train(str(tmp_path))
    _check(out['scalars'], np.array([out['losses']]), out['spreads'][None])


def _train_rank(rank, world, work_dir):
    return _train(work_dir, distributed=True)


def test_real_runner_quantiles_two_ranks(tmp_path):
    results = run_distributed(_train_rank, 2, str(tmp_path), timeout=240)
    losses = np.array([r['losses'] for r in results])
    assert not np.allclose(losses[0], losses[1])  # ranks really differ
    spreads = np.stack([r['spreads'] for r in results])
    _check(results[0]['scalars'], losses, spreads)


def test_real_runner_quantiles_of_worker_values(tmp_path, clean_mmengine):
    """The dataset reports its sample index in 2 DataLoader workers: each
    publication's p50/p99 of ``data/idx`` is that of the indices of exactly
    the batches its iterations consumed."""
    cfg = toy_cfg(
        str(tmp_path),
        by_epoch=False,
        max_iters=MAX_ITERS,
        log_interval=LOG_INTERVAL)
    cfg.train_dataloader.num_workers = 2
    cfg.train_dataloader.dataset.report_name = 'data/idx'
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook', stats=('num', ) + STATS),
        dict(type='BatchIdsHook')
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    ids = [h for h in runner.hooks if isinstance(h, BatchIdsHook)][0].ids
    scalars = _read_scalars(runner.log_dir)
    for step in range(LOG_INTERVAL, MAX_ITERS + 1, LOG_INTERVAL):
        window = np.concatenate(ids[step - LOG_INTERVAL:step]).astype(float)
        record = scalars[step]
        assert record['stats/data/idx/num'] == window.size
        assert record['stats/data/idx/mean'] == window.mean()
        for stat, q in (('p50', 0.5), ('p99', 0.99)):
            true = np.quantile(window, q, method='lower')
            assert_within_alpha(
                np.array([record[f'stats/data/idx/{stat}']]), np.array([true]),
                ALPHA + 1e-6)
