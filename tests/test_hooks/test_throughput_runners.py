"""ThroughputHook under FlexibleRunner on 2 gloo processes: DDPStrategy,
FSDPStrategy (FSDP1, flat and original parameters), FSDP2
(``mmstats.FullyShard``) and DeepSpeed ZeRO-2/3 publish the full model's
FLOPs (the compute runs on gathered parameters: never a shard's count) and
the samples of both ranks; under ``compile=True`` the FLOPs are counted and
training stays compiled."""
import pytest
from mmengine.runner import Runner

from tests.helpers.dist import run_distributed
from tests.helpers.flexible import flexible_cfg, use_strategy
from tests.helpers.runner import read_scalars, toy_cfg
from tests.helpers.toy import toy_flops_per_sample


def _train(rank, world_size, work_dir, strategy):
    from mmengine.runner import FlexibleRunner

    # an infinite sampler: batches of 8 on each rank
    cfg = flexible_cfg(
        work_dir,
        rank,
        num_samples=40,
        batch_size=8,
        max_iters=6,
        log_interval=3)
    use_strategy(cfg, strategy)
    cfg.custom_hooks = [dict(type='mmstats.ThroughputHook')]
    runner = FlexibleRunner.from_cfg(cfg)
    runner.train()
    return read_scalars(runner, missing_ok=True)


@pytest.mark.parametrize(
    'strategy', ['ddp', 'fsdp', 'fsdp_flat', 'fsdp2', 'zero2', 'zero3'])
def test_full_model_flops_and_all_samples(tmp_path, strategy):
    if strategy.startswith('zero'):
        pytest.importorskip('deepspeed')
    results = run_distributed(_train, 2, str(tmp_path), strategy, timeout=240)
    scalars = results[0]
    # 2 ranks x 3 iterations x 8 samples per interval
    for step in (3, 6):
        record = scalars[step]
        assert record['throughput/samples'] == 2 * 3 * 8
        assert record['throughput/flops'] == 2 * 3 * 8 * (
            toy_flops_per_sample())
        assert record['throughput/iters'] == 3


def test_compiled_training_stays_compiled(tmp_path, clean_mmengine):
    """Dynamo compiles ``train_step`` at the first iteration; the count at
    the second sees the eager ops once; the run stays compiled: as many
    graphs as the same run without the hook (counted at the first
    iteration, the counter's dispatch mode costs torch 2.14 one graph of
    five, 2.13 skipped frames)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    def train(hooks):
        torch._dynamo.reset()
        counters.clear()
        cfg = toy_cfg(
            tmp_path / str(len(hooks)),
            by_epoch=False,
            max_iters=4,
            log_interval=2)
        cfg.compile = dict(backend='eager')
        cfg.custom_hooks = hooks
        runner = Runner.from_cfg(cfg)
        try:
            runner.train()
            return runner, dict(counters['stats'])
        finally:
            torch._dynamo.reset()

    _, bare = train([])
    runner, graphs = train([dict(type='mmstats.ThroughputHook')])
    assert bare['unique_graphs'] >= 1
    assert graphs == bare, (graphs, bare)
    scalars = read_scalars(runner)
    for step in (2, 4):
        assert scalars[step]['throughput/flops'] == 2 * 16 * (
            toy_flops_per_sample())
