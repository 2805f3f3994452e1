"""mmstats.DeepSpeedStrategy's ZeRO-3 on CPU: parameters gathered one at a
time unless the config chooses (``sequential_gathers_on_cpu``).

DeepSpeed 0.18.6 (before deepspeedai/DeepSpeed#8539) re-gathers the persistent
parameters after every step with ``Init._allgather_params_coalesced``, which
waits only for the last of its async gloo gathers: a race that gave
uninitialised weights (a loss of 1e13) in ~1 checkpoint-matrix run of 10.
Counted here: the racy gathers of more than one parameter in a real 2-rank
FlexibleRunner run, none with the default, some where the config turns the
option off (so the count can fail)."""
import importlib.util

import pytest

from mmstats.strategies.deepspeed import sequential_gathers_on_cpu
from tests.helpers.dist import run_distributed
from tests.helpers.flexible import flexible_cfg, use_strategy

pytestmark = pytest.mark.skipif(
    not importlib.util.find_spec('deepspeed'),
    reason='DeepSpeed is not installed (requirements/tests.txt)')


def _train(rank, world, work_dir, sequential):
    from deepspeed.runtime.zero.partition_parameters import Init
    from mmengine.runner import FlexibleRunner
    cfg = flexible_cfg(work_dir, rank, max_iters=3)
    use_strategy(cfg, 'zero3')
    zero = cfg.strategy.zero_optimization
    zero.pop('stage3_param_persistence_threshold')  # DeepSpeed's default
    if sequential is not None:
        zero.stage3_allgather_sequential = sequential
    cfg.strategy.type = 'mmstats.DeepSpeedStrategy'
    coalesced = []
    racy = Init._allgather_params_coalesced

    def counted(self, param_list, *args, **kwargs):
        if len(param_list) > 1:
            coalesced.append(len(param_list))
        return racy(self, param_list, *args, **kwargs)

    Init._allgather_params_coalesced = counted
    try:
        runner = FlexibleRunner.from_cfg(cfg)
        runner.train()
    finally:
        Init._allgather_params_coalesced = racy
    chosen = runner.strategy.config['zero_optimization']
    return len(coalesced), chosen.get('stage3_allgather_sequential')


@pytest.mark.parametrize('sequential, racy', [(None, False), (False, True)])
def test_zero3_on_cpu_never_reads_a_coalesced_gather(tmp_path, sequential,
                                                     racy):
    results = run_distributed(_train, 2, str(tmp_path), sequential)
    for count, chosen in results:
        assert chosen is (sequential if sequential is not None else True)
        assert (count > 0) is racy, count  # 3 steps: 3 gathers or more


def test_only_zero3_on_cpu_without_a_choice_is_changed():
    zero = dict(stage=3)
    assert sequential_gathers_on_cpu(zero, 'cpu') == dict(
        stage=3, stage3_allgather_sequential=True)
    for unchanged in (dict(stage=2), dict(stage=3, allgather_sequential=False),
                      dict(stage=3, stage3_allgather_sequential=False)):
        assert sequential_gathers_on_cpu(unchanged, 'cpu') is unchanged
    assert sequential_gathers_on_cpu(zero, 'cuda') is zero
