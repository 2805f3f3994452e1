"""ModuleStatsHook reads gradients before clipping: with ``clip_grad`` the
published ``grad_norm`` / ``total_grad_norm`` are those mmengine computes
before it clips (its own logged ``grad_norm``), not the clipped ones."""
import pytest
from mmengine.runner import Runner

from tests.helpers.runner import read_scalars, toy_cfg

MAX_NORM = 1e-4  # every step clips


def test_gradient_statistics_are_taken_before_clipping(tmp_path,
                                                       clean_mmengine):
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        num_samples=32,
        batch_size=8,
        max_iters=3,
        log_interval=1)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.train_cfg.pop('val_interval', None)
    cfg.optim_wrapper = dict(
        optimizer=dict(type='SGD', lr=0.1), clip_grad=dict(max_norm=MAX_NORM))
    cfg.custom_hooks = [
        dict(
            type='mmstats.StatsCollectorHook',
            stats=('mean', ),
            collect=('outputs', )),
        dict(
            type='mmstats.ModuleStatsHook',
            modules='head',
            stats=('grad_norm', )),
    ]
    runner = Runner.from_cfg(cfg)
    runner.train()
    # mmengine's own grad_norm of every step: the total norm it computes
    # before it clips (the message hub keeps each iteration's value)
    history = runner.message_hub.get_scalar('train/grad_norm').data[0]
    published = read_scalars(runner)
    assert sorted(published) == [1, 2, 3]
    for step, scalars in published.items():
        total = scalars['stats/modules/total_grad_norm/mean']
        assert total == pytest.approx(history[step - 1], rel=1e-6), step
        assert total > 100 * MAX_NORM
        assert scalars['stats/modules/head/grad_norm/mean'] <= total
