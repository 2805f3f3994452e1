"""ModuleStatsHook on CUDA in a real Runner: fp16 AmpOptimWrapper with
forced overflow steps, and compile=True; every published module statistic
against a float64 recomputation (skipped without CUDA)."""
import pytest
import torch
from torch._dynamo.utils import counters

from tests.helpers.module_stats import (CountGraphs, Overflow, check, one_rank,
                                        scalars, step_record, train)
from .common import requires_cuda

pytestmark = requires_cuda


def test_fp16_amp_overflow(tmp_path, clean_mmengine):
    """GradScaler (fp16) skips the steps of iterations 2 and 6: no
    grad_norm/update_ratio for them, no FloatingPointError, both counted;
    the other norms are of the unscaled gradients."""
    recorder = train(tmp_path, amp='AmpOptimWrapper', hooks=[Overflow((2, 6))])
    assert sorted(recorder.steps) == [1, 3, 4, 5]
    published = scalars(tmp_path)
    acts, steps = one_rank(recorder, (3, ))
    steps[6] = {n: [v] for n, v in step_record(recorder, 5).items()}
    acts[6] = {n: [a] for n, a in recorder.acts[6].items()}
    check(published, acts, steps, (3, 6), no_step=(6, ))
    assert published[3]['stats/modules/amp_skipped_steps/mean'] == 1
    assert published[6]['stats/modules/amp_skipped_steps/mean'] == 1


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    torch._dynamo.config.error_on_recompile = False


def test_compile_exact_and_no_recompile(tmp_path, clean_mmengine,
                                        fresh_dynamo):
    graphs = CountGraphs(warmup=2)
    recorder = train(tmp_path, compile=True, hooks=[graphs])
    check(scalars(tmp_path), *one_rank(recorder, (3, 6)), (3, 6))
    assert graphs.graphs[6] == graphs.graphs[2] > 0
