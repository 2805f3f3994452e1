"""ModuleStatsHook instruments exactly the iterations StatsCollectorHook
publishes after: the collector's own interval (not LoggerHook's), its
``by_epoch`` summaries, and the last iteration of an iteration-based run."""
import pytest
from mmengine.runner import Runner

from tests.helpers.runner import read_scalars, toy_cfg

BATCH = 16
LOGITS = 10


def _train(tmp_path, by_epoch, collector):
    cfg = toy_cfg(
        tmp_path,
        by_epoch=by_epoch,
        num_samples=5 * BATCH,
        batch_size=BATCH,
        max_epochs=2,
        max_iters=7,
        log_interval=3)
    cfg.custom_hooks = [
        dict(
            type='mmstats.StatsCollectorHook',
            collect=('outputs', ),
            stats=('num', 'mean'),
            **collector),
        dict(type='mmstats.ModuleStatsHook', modules='head', stats=('act', ))
    ]
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.train_cfg.pop('val_interval', None)
    runner = Runner.from_cfg(cfg)
    runner.train()
    return read_scalars(runner)


@pytest.mark.parametrize(
    'by_epoch,collector,steps',
    [
        # the collector's interval 2 beside LoggerHook's 3, iteration-based:
        # LoggerHook's lines (3, 6), the collector's own (2, 4, 6), the end (7)
        (False, dict(interval=2), [2, 3, 4, 6, 7]),
        # one summary per epoch (the step is the epoch)
        (True, dict(by_epoch=True), [1, 2]),
    ])
def test_instrumented_exactly_where_published(tmp_path, clean_mmengine,
                                              by_epoch, collector, steps):
    published = _train(tmp_path, by_epoch, collector)
    with_loss = sorted(s for s, r in published.items()
                       if 'stats/loss/num' in r)
    with_act = sorted(s for s, r in published.items()
                      if 'stats/modules/head/act/num' in r)
    assert with_loss == steps
    assert with_act == steps  # every publication has its module statistics
    for step in steps:  # of one iteration: one batch of logits
        assert published[step]['stats/modules/head/act/num'] == BATCH * LOGITS
