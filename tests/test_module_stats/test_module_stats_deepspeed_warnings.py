"""ModuleStatsHook under DeepSpeedStrategy (ZeRO-2, FlexibleRunner, 2 gloo
processes) with parameter schedulers: the hook wraps the optimizer
wrapper's ``step`` after the schedulers wrapped it, and no warning comes
from that. mmengine's schedulers warn "Seems like `optimizer.step()` has
been overridden after parameter value scheduler initialization" at their
first step when the step lost their ``_with_counter`` mark; the run with
the hook warns nothing from mmengine that the same run without it does not,
the schedule still runs, and the schedulers' step is back after training.
"""
import logging
import warnings

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.flexible import flexible_cfg, use_strategy
from tests.helpers.runner import read_scalars

OVERRIDDEN = 'has been overridden after parameter value scheduler'
MAX_ITERS = 4
LR = 1e-2  # tests/helpers/deepspeed.py's AdamW


def _run(work_dir, rank, with_hook):
    """One run; ``(warnings.warn messages from mmengine, mmengine logger
    warnings not from mmstats, the final lr, whether the wrapper's step
    carries the schedulers' mark after training, the steps that published
    the head's gradient norm)``."""
    from mmengine.runner import FlexibleRunner
    cfg = flexible_cfg(
        f'{work_dir}/{"hook" if with_hook else "plain"}',
        rank,
        num_samples=32,
        batch_size=8,
        max_iters=MAX_ITERS,
        log_interval=2)
    use_strategy(cfg, 'zero2')
    # two schedulers: each checks the mark at its first step
    cfg.param_scheduler = [
        dict(type='LinearLR', start_factor=0.5, by_epoch=False, end=2),
        dict(type='MultiStepLR', milestones=[3], gamma=0.1, by_epoch=False),
    ]
    cfg.custom_hooks = [dict(type='mmstats.StatsCollectorHook')]
    if with_hook:
        cfg.custom_hooks.append(
            dict(
                type='mmstats.ModuleStatsHook',
                modules=r'backbone\.stem|head'))
    runner = FlexibleRunner.from_cfg(cfg)
    logged = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = logged.append
    runner.logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            runner.train()
    finally:
        runner.logger.removeHandler(handler)
    from_mmengine = sorted(
        str(w.message) for w in caught if '/mmengine/' in w.filename)
    log = sorted(r.getMessage() for r in logged
                 if not r.getMessage().startswith(('ModuleStatsHook',
                                                   'StatsCollectorHook')))
    marked = getattr(runner.optim_wrapper.step, '_with_counter', False)
    grads = [
        step for step, record in read_scalars(runner, missing_ok=True).items()
        if 'stats/modules/head/grad_norm/mean' in record
    ]
    return (from_mmengine, log, runner.optim_wrapper.get_lr()['lr'], marked,
            grads)


def _train(rank, world_size, work_dir):
    return dict(
        plain=_run(work_dir, rank, with_hook=False),
        hook=_run(work_dir, rank, with_hook=True))


def test_no_scheduler_warning_from_the_step_wrapper(tmp_path):
    pytest.importorskip('deepspeed')
    ranks = run_distributed(_train, 2, str(tmp_path), timeout=300)
    for rank in ranks:
        plain, hook = rank['plain'], rank['hook']
        assert sum(OVERRIDDEN in m for m in hook[0] + hook[1]) == 0, hook
        assert sum(OVERRIDDEN in m for m in plain[0] + plain[1]) == 0, plain
        # nothing of mmengine's warns because of the hook (the plain run
        # goes first: it has the process's once-only deprecation notes)
        assert set(hook[0]) <= set(plain[0]), (plain, hook)
        assert set(hook[1]) <= set(plain[1]), (plain, hook)
        # the schedule ran: LinearLR up to 1e-2, MultiStepLR's 0.1 at 3
        assert hook[2] == pytest.approx([LR * 0.1]) == plain[2]
        # the schedulers' own step is back after training
        assert hook[3] is True and plain[3] is True
    # the hook's step wrapper ran: the gradient norms of both publications
    assert ranks[0]['hook'][4] == [2, 4] and ranks[0]['plain'][4] == []
