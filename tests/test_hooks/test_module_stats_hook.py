"""ModuleStatsHook: every published module statistic against a float64
recomputation from the raw tensors, in real Runners (eager and
``compile=True``, 1 and 2 gloo ranks, gradient accumulation, a frozen
module, activation checkpointing, CPU AMP with overflow steps); the
schedule, optimizer hooks, argument errors and norms on their own."""
import os.path as osp
from unittest.mock import MagicMock, patch

import numpy as np
import pytest
import torch
from mmengine.hooks import LoggerHook
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, Runner
from torch import nn
from torch._dynamo.utils import counters

from mmstats import Collector, ModuleStatsHook, StatsCollectorHook
from tests.helpers.dist import run_distributed
from tests.helpers.module_stats import (MODULES, NAMES, CountGraphs, Overflow,
                                        check, norm, one_rank, scalars,
                                        step_hooks, step_record, train)
from tests.helpers.runner import clear_mmengine_singletons, toy_cfg


def test_real_runner_exact(tmp_path, clean_mmengine):
    recorder = train(tmp_path)
    check(scalars(tmp_path), *one_rank(recorder, (3, 6)), (3, 6))
    assert sorted(recorder.steps) == [1, 2, 3, 4, 5, 6]


def test_frozen_module_and_accumulation(tmp_path, clean_mmengine):
    """Steps at iterations 2, 4, 6; publications at 3 and 6 show the
    gradients of the steps at 2 and 6. The frozen stem has no grads."""
    recorder = train(tmp_path, freeze='backbone.stem', accumulative_counts=2)
    assert sorted(recorder.steps) == [2, 4, 6]
    check(
        scalars(tmp_path),
        *one_rank(recorder, (3, 6), step_of={
            3: 2,
            6: 6
        }), (3, 6),
        frozen='backbone.stem')


@pytest.mark.parametrize('use_reentrant', [False, True])
def test_activation_checkpointing(tmp_path, clean_mmengine, use_reentrant):
    """The recomputation in backward fires layer1's forward hooks again:
    its outputs still count once."""
    recorder = train(
        tmp_path,
        model=dict(type='CheckpointedToy', use_reentrant=use_reentrant))
    assert {(it, 'backbone.layer1.0') for it in range(1, 7)} <= \
        recorder.recomputed
    check(scalars(tmp_path), *one_rank(recorder, (3, 6)), (3, 6))


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    with patch.object(torch._dynamo.config, 'error_on_recompile', False):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize('compile', [False, True])
def test_amp_overflow_and_huge_loss_scale(tmp_path, clean_mmengine,
                                          fresh_dynamo, compile):
    """bf16 autocast + GradScaler at 2**70 (float32 squares of the scaled
    gradients overflow): the norms are of the unscaled gradients; the steps
    skipped at iterations 2 and 6 (6 publishes) give no grad_norm or
    update_ratio, do not trip on_nonfinite='raise', and are counted; eager
    and compile=True (inductor)."""
    recorder = train(
        tmp_path,
        amp='CpuAmpOptimWrapper',
        hooks=[Overflow((2, 6))],
        compile=compile)
    assert sorted(recorder.steps) == [1, 3, 4, 5]  # 2 and 6 skipped
    published = scalars(tmp_path)
    acts, steps = one_rank(recorder, (3, ))
    steps[6] = {n: [v] for n, v in step_record(recorder, 5).items()}
    acts[6] = {n: [a] for n, a in recorder.acts[6].items()}
    check(published, acts, steps, (3, 6), no_step=(6, ))
    assert published[3]['stats/modules/amp_skipped_steps/mean'] == 1
    assert published[6]['stats/modules/amp_skipped_steps/mean'] == 1


def test_compile_exact_and_no_recompile(tmp_path, clean_mmengine,
                                        fresh_dynamo):
    """mmengine's compile=True (inductor): every instrumented iteration
    exact, and no graph compiled after the warm-up (the optimizer's first
    step, iteration 2) although the hooks are armed at 3 and 6."""
    graphs = CountGraphs(warmup=2)
    recorder = train(tmp_path, compile=True, hooks=[graphs])
    check(scalars(tmp_path), *one_rank(recorder, (3, 6)), (3, 6))
    assert graphs.graphs[6] == graphs.graphs[2] > 0


def _graphs_after(work_dir, modules):
    torch._dynamo.reset()
    counters.clear()
    hooks = [dict(type='mmstats.StatsCollectorHook')]
    if modules:
        hooks.append(dict(type='mmstats.ModuleStatsHook', modules=modules))
    cfg = toy_cfg(
        work_dir,
        by_epoch=False,
        max_iters=6,
        log_interval=3,
        compile=dict(backend='eager'),
        custom_hooks=hooks)
    Runner.from_cfg(cfg).train()
    return counters['stats']['unique_graphs'], sum(
        counters['graph_break'].values())


def test_compile_adds_no_graph(tmp_path, clean_mmengine, fresh_dynamo):
    """The same run with and without ModuleStatsHook compiles as many
    graphs (dynamo only; backend='eager'): its forward hooks are one
    custom op each in the user's graph, its step hooks run eagerly."""
    without = _graphs_after(tmp_path / 'a', None)
    clear_mmengine_singletons()
    with_hook = _graphs_after(tmp_path / 'b', MODULES)
    assert with_hook[0] == without[0]
    assert with_hook[1] <= without[1]


def _dist_worker(rank, world_size, work_dir):
    recorder = train(osp.join(work_dir, str(rank)), dist=True)
    return dict(
        acts={it: recorder.acts[it]
              for it in (3, 6)},
        steps={it: step_record(recorder, it)
               for it in (3, 6)})


def test_two_gloo_ranks(tmp_path):
    results = run_distributed(_dist_worker, 2, str(tmp_path))
    published = scalars(osp.join(tmp_path, '0'))
    acts = {
        it: {
            n: [r['acts'][it][n] for r in results]
            for n in NAMES
        }
        for it in (3, 6)
    }
    steps = {
        it: {
            n: [r['steps'][it][n] for r in results]
            for n in NAMES
        }
        for it in (3, 6)
    }
    check(published, acts, steps, (3, 6))
    # DDP reduced the gradients: both ranks saw the same ones
    for name in NAMES:
        for a, b in zip(steps[3][name][0][0], steps[3][name][1][0]):
            np.testing.assert_allclose(a, b, rtol=1e-6)


# ------------------------------------------------------ hook logic alone
def _mock_runner(model,
                 loader_len=23,
                 by_epoch=True,
                 log_interval=10,
                 collector=True):
    runner = MagicMock()
    runner.model = model
    runner.train_dataloader = [None] * loader_len
    runner.train_loop = MagicMock(
        spec=EpochBasedTrainLoop if by_epoch else IterBasedTrainLoop)
    hooks = [LoggerHook(interval=log_interval)]
    if collector:
        hooks.append(StatsCollectorHook())
        hooks[-1].before_run(runner)  # resolves its interval
    runner.hooks = hooks
    runner.optim_wrapper = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1))
    return runner


def _toy():
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def test_publication_iterations_follow_the_logger():
    runner = _mock_runner(_toy())
    hook = ModuleStatsHook(modules=r'\d')
    hook.before_run(runner)
    hook.before_train(runner)
    assert [i for i in range(23)
            if hook.publishes_after(runner, i)] == [9, 19, 22]
    runner = _mock_runner(
        _toy(),
        by_epoch=False,
        loader_len=1000,
        log_interval=4,
        collector=False)
    hook.before_run(runner)
    hook.before_train(runner)
    assert [i for i in range(12)
            if hook.publishes_after(runner, i)] == [3, 7, 11]


def test_hooks_registered_once_and_armed_only_when_published():
    """Forward and step hooks exist from before_train (before a compile
    would trace them) to after_train, and report only on the iterations
    that publish."""
    model = _toy()
    runner = _mock_runner(model)
    optimizer = runner.optim_wrapper.optimizer
    hook = ModuleStatsHook(modules=r'0|2')
    assert not model[0]._forward_hooks  # nothing live before a run
    hook.before_run(runner)
    hook.before_train(runner)
    assert sorted(hook.targets) == ['0', '2']
    collector = Collector('modules/.*', keep_previous=False)
    published = []
    for batch_idx in range(23):
        assert len(model[0]._forward_hooks) == len(model[2]._forward_hooks)
        assert len(model[0]._forward_hooks) == 1
        assert step_hooks(optimizer) == 1
        hook.before_train_iter(runner, batch_idx)
        runner.optim_wrapper.update_params(model(torch.randn(4, 3)).sum())
        hook.after_train_iter(runner, batch_idx)
        collector.update()
        if 'modules/0/act' in collector.names() and collector.num(
                'modules/0/act'):
            assert collector.num('modules/0/act') == 16
            assert collector.num('modules/2/grad_norm') == 1
            published.append(batch_idx)
    assert published == [9, 19, 22]
    hook.after_train(runner)
    assert not model[0]._forward_hooks and not model[2]._forward_hooks
    assert step_hooks(optimizer) == 0


def test_optim_wrapper_dict_one_pair_of_hooks_per_optimizer():
    """OptimWrapperDict (GAN-style): each optimizer reports the modules
    whose parameters it owns, at its own step, exactly."""
    torch.manual_seed(0)
    model = _toy()
    runner = _mock_runner(model)
    runner.optim_wrapper = OptimWrapperDict(
        first=OptimWrapper(torch.optim.SGD(model[0].parameters(), lr=0.1)),
        last=OptimWrapper(torch.optim.SGD(model[2].parameters(), lr=0.1)))
    hook = ModuleStatsHook(modules=r'0|2', stats=('grad_norm', ))
    hook.before_run(runner)
    hook.before_train(runner)
    assert [step_hooks(w.optimizer)
            for w in runner.optim_wrapper.values()] == [1, 1]
    collector = Collector('modules/.*', keep_previous=False)
    hook.before_train_iter(runner, 9)
    loss = model(torch.randn(4, 3)).square().sum()
    loss.backward()
    expected = {
        i: norm([p.grad.double().numpy() for p in model[i].parameters()])
        for i in (0, 2)
    }
    runner.optim_wrapper['first'].step()
    runner.optim_wrapper['last'].step()
    hook.after_train_iter(runner, 9)
    collector.update()
    for i in (0, 2):
        assert collector.num(f'modules/{i}/grad_norm') == 1
        assert collector.mean(f'modules/{i}/grad_norm') == pytest.approx(
            expected[i], rel=1e-12)


def test_bad_modules_fail_early():
    with pytest.raises(ValueError, match='modules=.*valid regular'):
        ModuleStatsHook(modules='backbone[')
    with pytest.raises(TypeError, match='modules must be'):
        ModuleStatsHook(modules=None)
    hook = ModuleStatsHook(modules='backbone')
    with pytest.raises(ValueError, match="modules='backbone' matches no"):
        mocked = _mock_runner(_toy())
        hook.before_run(mocked)
        hook.before_train(mocked)


def test_layerdrop_norms_follow_the_gradients():
    """A different set of layers (so of parameters with a gradient) every
    iteration, published every iteration: exact norms of exactly the
    modules with a gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(3, 3) for _ in range(5)])
    runner = _mock_runner(model)
    runner.hooks[-1].interval = 1  # StatsCollectorHook: every iteration
    hook = ModuleStatsHook(modules=r'\d', stats=('grad_norm', ))
    hook.before_run(runner)
    hook.before_train(runner)
    collector = Collector('modules/.*', keep_previous=False)
    for batch_idx in range(20):
        keep = [i for i in range(5) if (batch_idx >> i) & 1 or i == 4]
        hook.before_train_iter(runner, batch_idx)
        x = torch.randn(2, 3)
        for i in keep:
            x = model[i](x)
        x.sum().backward()
        expected = {
            i: norm([p.grad.double().numpy() for p in model[i].parameters()])
            for i in keep
        }
        runner.optim_wrapper.step()
        runner.optim_wrapper.zero_grad()
        hook.after_train_iter(runner, batch_idx)
        collector.update()
        for i in range(5):
            name = f'modules/{i}/grad_norm'
            got = collector.num(name) if name in collector.names() else 0
            assert got == (i in keep), (batch_idx, i)
            if i in keep:
                assert collector.mean(name) == pytest.approx(
                    expected[i], rel=1e-12)


def test_stats_subset():
    """stats=('grad_norm',): no forward hooks, only gradient norms."""
    model = _toy()
    runner = _mock_runner(model)
    hook = ModuleStatsHook(modules='0', stats=('grad_norm', ))
    hook.before_run(runner)
    hook.before_train(runner)
    collector = Collector('modules/.*')
    hook.before_train_iter(runner, 9)
    assert not model[0]._forward_hooks and hook._acts is None
    runner.optim_wrapper.update_params(model(torch.randn(4, 3)).sum())
    hook.after_train_iter(runner, 9)
    collector.update()
    assert collector.names() == [
        'modules/0/grad_norm', 'modules/instrument_ms',
        'modules/total_grad_norm'
    ]
    hook.after_train(runner)
    hook = ModuleStatsHook(modules='0', stats=('act', ))
    hook.before_run(runner)
    hook.before_train(runner)  # no AMP: nothing to take at the steps
    assert step_hooks(runner.optim_wrapper.optimizer) == 0
    assert len(model[0]._forward_hooks) == 1
    with pytest.raises(ValueError, match='stats must be'):
        ModuleStatsHook(modules='0', stats=('act', 'typo'))
