"""The line a run starts with (``mmstats/run_description.py``), through
real runners: mmengine's ``Runner`` on 1 process and with DDP on 2 gloo
processes, ``FlexibleRunner`` with FSDP1, FSDP2 and DeepSpeed ZeRO-3 on 2.
PreciseBNHook and ThroughputHook both ask for it at ``before_train``: the
log holds it exactly once."""
import os.path as osp

import pytest
from mmengine.runner import Runner

from mmstats.run_description import describe_run, log_run_description
from tests.helpers.dist import run_distributed
from tests.helpers.flexible import flexible_cfg, use_strategy
from tests.helpers.runner import gloo_launch, toy_cfg

#: two hooks that both log the line; PreciseBNHook never recomputes here
HOOKS = [
    dict(
        type='mmstats.PreciseBNHook',
        num_samples=16,
        interval=1000,
        at_end=False),
    dict(type='mmstats.ThroughputHook'),
]


def logged_descriptions(runner) -> list:
    """The ``mmstats: ...`` messages of the runner's log file (rank 0's:
    the other ranks write none)."""
    path = osp.join(runner.log_dir, f'{runner.timestamp}.log')
    if not osp.exists(path):
        return []
    with open(path) as f:
        return [
            line.split(' - INFO - ', 1)[1].rstrip('\n') for line in f
            if ' - INFO - mmstats: ' in line
        ]


def test_one_process_runner(tmp_path, clean_mmengine):
    cfg = toy_cfg(tmp_path, by_epoch=False, max_iters=2, log_interval=1)
    cfg.custom_hooks = HOOKS
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert logged_descriptions(runner) == ['mmstats: Runner, 1 process']
    # once per runner: a later call logs nothing, another runner logs again
    assert log_run_description(runner) is None
    assert describe_run(runner) == 'mmstats: Runner, 1 process'


def _train(rank, world_size, work_dir, strategy):
    from mmengine.runner import FlexibleRunner
    cfg = flexible_cfg(work_dir, rank, max_iters=2, log_interval=1)
    cfg.custom_hooks = HOOKS
    if strategy == 'runner_ddp':
        runner = Runner.from_cfg(gloo_launch(cfg))
    else:
        use_strategy(cfg, strategy)
        if strategy == 'fsdp':  # units: stem (88 parameters), layer1's
            # conv (576), head (90) and the root (layer1's BN, 16)
            cfg.strategy.model_wrapper.auto_wrap_policy = dict(
                type='torch.distributed.fsdp.wrap.size_based_auto_wrap_policy',
                min_num_params=80)
        runner = FlexibleRunner.from_cfg(cfg)
    runner.train()
    return logged_descriptions(runner), describe_run(runner)


EXPECTED = {
    'runner_ddp':
    'mmstats: Runner, DDP (MMDistributedDataParallel), 2 ranks, gloo',
    'fsdp':
    'mmstats: FlexibleRunner, FSDP1 (MMFullyShardedDataParallel, 4 units), '
    '2 ranks, gloo',
    'fsdp2':
    'mmstats: FlexibleRunner, FSDP2 (fully_shard on 3 modules + root), '
    '2 ranks, gloo',
    'zero3':
    'mmstats: FlexibleRunner, DeepSpeed ZeRO-3, 2 ranks, gloo',
}


@pytest.mark.parametrize('strategy', list(EXPECTED))
def test_two_processes(tmp_path, strategy):
    if strategy.startswith('zero'):
        pytest.importorskip('deepspeed')
    (logged0, line0), (logged1, line1) = run_distributed(
        _train, 2, str(tmp_path), strategy, timeout=240)
    assert logged0 == [EXPECTED[strategy]]  # exactly once, rank 0's log
    assert logged1 == []  # rank 1 writes no log file
    assert line0 == line1 == EXPECTED[strategy]


def test_an_evaluation_engine_says_its_stage_zero_is_the_evaluation():
    """mmstats.DeepSpeedStrategy evaluates a ZeRO-3 checkpoint with a
    stage-0 engine without an optimizer: said so, not a bare ZeRO-0."""
    from types import SimpleNamespace

    from mmstats.run_description import describe_model
    engine = SimpleNamespace(zero_optimization_stage=lambda: 0, optimizer=None)
    wrapper = SimpleNamespace(model=engine)  # MMDeepSpeedEngineWrapper
    assert describe_model(wrapper) == (
        'DeepSpeed ZeRO-0, evaluation: whole weights on every rank')
    engine.zero_optimization_stage, engine.optimizer = lambda: 3, object()
    assert describe_model(wrapper) == 'DeepSpeed ZeRO-3'
