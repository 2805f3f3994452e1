"""ModuleStatsHook: every published module statistic against a float64
recomputation from the raw tensors, in real Runners on 1 and 2 gloo ranks;
the interval logic, argument errors and AMP unscaling on their own."""
import json
import os.path as osp
from unittest.mock import MagicMock, patch

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook, LoggerHook
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, Runner
from torch import nn

from mmstats import Collector, ModuleStatsHook, StatsCollectorHook
from tests.helpers.dist import run_distributed
from tests.helpers.runner import gloo_launch, toy_cfg

NAMES = ('backbone.stem', 'backbone.layer1', 'head')
MODULES = r'backbone\.(stem|layer1)|head'


class RawRecorder(Hook):
    """Keep, per iteration, the raw outputs of NAMES, the gradients and
    weights around each optimizer step, and how many hooks were attached."""
    priority = 'VERY_HIGH'

    def __init__(self, freeze=None):
        self.freeze = freeze
        self.acts, self.steps, self.hooks_seen = {}, {}, {}
        self.iter = 0

    def before_train(self, runner):
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self.modules = {n: m for n, m in model.named_modules() if n in NAMES}
        if self.freeze:
            self.modules[self.freeze].requires_grad_(False)
        for name, module in self.modules.items():
            module.register_forward_hook(self._forward_hook(name))
        optim_wrapper = runner.optim_wrapper
        optimizer, original = optim_wrapper.optimizer, None
        original = optimizer.step

        def step(*args, **kwargs):
            grads = {
                n: [
                    p.grad.double().cpu().numpy().copy()
                    for p in m.parameters() if p.grad is not None
                ]
                for n, m in self.modules.items()
            }
            before = self._weights()
            original(*args, **kwargs)
            self.steps[self.iter] = dict(
                grads=grads,
                before=before,
                after=self._weights(),
                patched='step' in vars(optim_wrapper))

        optimizer.step = step

    def _weights(self):
        return {
            n:
            [p.detach().double().cpu().numpy().copy() for p in m.parameters()]
            for n, m in self.modules.items()
        }

    def _forward_hook(self, name):

        def hook(module, args, output):
            if not module.training:  # the validation after training
                return
            self.acts.setdefault(self.iter, {})[name] = (
                output.detach().double().cpu().numpy().copy())
            self.hooks_seen.setdefault(self.iter,
                                       {})[name] = len(module._forward_hooks)

        return hook

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.iter = runner.iter + 1


def _norm(arrays):
    return np.sqrt(sum((a**2).sum() for a in arrays))


def _scalars(work_dir):
    path = [
        osp.join(work_dir, d, 'vis_data', 'scalars.json')
        for d in sorted(__import__('os').listdir(work_dir))
        if osp.isdir(osp.join(work_dir, d, 'vis_data'))
    ][-1]
    merged = {}
    for line in open(path):
        record = json.loads(line)
        merged.setdefault(record['step'], {}).update(record)
    return merged


def _train(work_dir,
           dist=False,
           freeze=None,
           accumulative_counts=1,
           amp=False):
    cfg = toy_cfg(
        work_dir,
        by_epoch=False,
        max_iters=6,
        log_interval=3,
        custom_hooks=[
            dict(type='mmstats.StatsCollectorHook'),
            dict(type='mmstats.ModuleStatsHook', modules=MODULES)
        ])
    cfg.optim_wrapper.accumulative_counts = accumulative_counts
    if amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
    if dist:
        gloo_launch(cfg)
    runner = Runner.from_cfg(cfg)
    recorder = RawRecorder(freeze)
    runner.register_hook(recorder)
    runner.train()
    return recorder


def _check(scalars, acts, steps, publications, frozen=None):
    """``acts``: {iter: {name: [arrays of all ranks]}}, ``steps``:
    {publication: {name: (grads, before, after) per rank}}."""
    for it in publications:
        record = scalars[it]
        for name in NAMES:
            values = np.concatenate([a.ravel() for a in acts[it][name]])
            key = f'stats/modules/{name}/act'
            for stat, ref in (('mean', values.mean()), ('std', values.std()),
                              ('min', values.min()), ('max', values.max())):
                np.testing.assert_allclose(
                    record[f'{key}/{stat}'],
                    ref,
                    rtol=1e-5,
                    atol=1e-7,
                    err_msg=f'{it} {name} {stat}')
            per_rank = steps[it][name]
            weight = [_norm(after) for _, _, after in per_rank]
            np.testing.assert_allclose(
                record[f'stats/modules/{name}/weight_norm/mean'],
                np.mean(weight),
                rtol=1e-6)
            if name == frozen:
                assert f'stats/modules/{name}/grad_norm/mean' not in record
                assert f'stats/modules/{name}/update_ratio/mean' not in record
                continue
            grad = [_norm(g) for g, _, _ in per_rank]
            ratio = [
                _norm([a - b for a, b in zip(after, before)]) / _norm(before)
                for _, before, after in per_rank
            ]
            for stat, ref in (('mean', np.mean(grad)), ('max', max(grad))):
                np.testing.assert_allclose(
                    record[f'stats/modules/{name}/grad_norm/{stat}'],
                    ref,
                    rtol=1e-6)
            np.testing.assert_allclose(
                record[f'stats/modules/{name}/update_ratio/mean'],
                np.mean(ratio),
                rtol=1e-6)
            assert ratio[0] > 0
        assert record['stats/modules/instrument_ms/mean'] > 0


def _step_record(recorder, step_iter):
    s = recorder.steps[step_iter]
    return {n: (s['grads'][n], s['before'][n], s['after'][n]) for n in NAMES}


def _hooks_only_when_published(recorder, publications):
    for it, seen in recorder.hooks_seen.items():
        expected = 2 if it in publications else 1  # ours + the recorder's
        assert set(seen.values()) == {expected}, (it, seen)


def test_real_runner_exact(tmp_path, clean_mmengine):
    recorder = _train(tmp_path)
    scalars = _scalars(tmp_path)
    assert sorted(s for s, r in scalars.items()
                  if 'stats/modules/head/act/mean' in r) == [3, 6]
    acts = {
        it: {
            n: [a]
            for n, a in recorder.acts[it].items()
        }
        for it in (3, 6)
    }
    steps = {
        it: {
            n: [v]
            for n, v in _step_record(recorder, it).items()
        }
        for it in (3, 6)
    }
    _check(scalars, acts, steps, (3, 6))
    _hooks_only_when_published(recorder, (3, 6))
    assert [it for it, s in recorder.steps.items() if s['patched']] == [3, 6]


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="mmengine's AmpOptimWrapper needs CUDA")
def test_real_runner_amp(tmp_path, clean_mmengine):
    """The recorder sees the gradients inside GradScaler.step (unscaled):
    the published norms must be the unscaled ones."""
    recorder = _train(tmp_path, amp=True)
    scalars = _scalars(tmp_path)
    acts = {
        it: {
            n: [a]
            for n, a in recorder.acts[it].items()
        }
        for it in (3, 6)
    }
    steps = {
        it: {
            n: [v]
            for n, v in _step_record(recorder, it).items()
        }
        for it in (3, 6)
    }
    _check(scalars, acts, steps, (3, 6))


def test_frozen_module_and_accumulation(tmp_path, clean_mmengine):
    """Steps at iterations 2, 4, 6; publications at 3 and 6 show the
    gradients of the steps at 2 and 6. The frozen stem has no grads."""
    recorder = _train(tmp_path, freeze='backbone.stem', accumulative_counts=2)
    assert sorted(recorder.steps) == [2, 4, 6]
    assert [it for it, s in recorder.steps.items() if s['patched']] == [2, 6]
    scalars = _scalars(tmp_path)
    acts = {
        it: {
            n: [a]
            for n, a in recorder.acts[it].items()
        }
        for it in (3, 6)
    }
    steps = {
        3: {
            n: [v]
            for n, v in _step_record(recorder, 2).items()
        },
        6: {
            n: [v]
            for n, v in _step_record(recorder, 6).items()
        }
    }
    _check(scalars, acts, steps, (3, 6), frozen='backbone.stem')
    _hooks_only_when_published(recorder, (3, 6))


def _dist_worker(rank, world_size, work_dir):
    recorder = _train(osp.join(work_dir, str(rank)), dist=True)
    return dict(
        acts={it: recorder.acts[it]
              for it in (3, 6)},
        steps={it: _step_record(recorder, it)
               for it in (3, 6)},
        seen=recorder.hooks_seen)


def test_two_gloo_ranks(tmp_path):
    results = run_distributed(_dist_worker, 2, str(tmp_path))
    scalars = _scalars(osp.join(tmp_path, '0'))
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
    _check(scalars, acts, steps, (3, 6))
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
    hook.before_train(runner)
    assert [i for i in range(23)
            if hook.publishes_after(runner, i)] == [9, 19, 22]
    runner = _mock_runner(
        _toy(),
        by_epoch=False,
        loader_len=1000,
        log_interval=4,
        collector=False)
    hook.before_train(runner)
    assert [i for i in range(12)
            if hook.publishes_after(runner, i)] == [3, 7, 11]


def test_attached_only_on_instrumented_iterations():
    model = _toy()
    runner = _mock_runner(model)
    hook = ModuleStatsHook(modules=r'0|2')
    hook.before_train(runner)
    assert sorted(hook.targets) == ['0', '2']
    for batch_idx in range(23):
        hook.before_train_iter(runner, batch_idx)
        published = batch_idx in (9, 19, 22)
        assert bool(model[0]._forward_hooks) == published
        assert ('step' in vars(runner.optim_wrapper)) == published
        hook.after_train_iter(runner, batch_idx)
        assert not model[0]._forward_hooks and not model[2]._forward_hooks
        assert 'step' not in vars(runner.optim_wrapper)


def test_bad_modules_fail_early():
    with pytest.raises(ValueError, match='modules=.*valid regular'):
        ModuleStatsHook(modules='backbone[')
    with pytest.raises(TypeError, match='modules must be'):
        ModuleStatsHook(modules=None)
    hook = ModuleStatsHook(modules='backbone')
    with pytest.raises(ValueError, match="modules='backbone' matches no"):
        hook.before_train(_mock_runner(_toy()))


def test_amp_gradients_are_unscaled():
    """AmpOptimWrapper (CUDA-only in mmengine; built here with a CPU
    GradScaler): the reported norm is that of the unscaled gradients."""
    from mmengine.optim import AmpOptimWrapper
    torch.manual_seed(0)
    model = _toy()
    x = torch.randn(5, 3)
    reference = _toy()
    reference.load_state_dict(model.state_dict())
    reference(x).square().sum().backward()
    expected = _norm(
        [p.grad.double().numpy() for p in reference[0].parameters()])
    with patch(
            'mmengine.optim.optimizer.amp_optimizer_wrapper.'
            'is_cuda_available',
            return_value=True):
        wrapper = AmpOptimWrapper(
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    wrapper.loss_scaler = torch.amp.GradScaler('cpu', init_scale=1024.)
    collector = Collector('modules/.*')
    hook = ModuleStatsHook(modules='0')
    hook.targets = {'0': model[0]}
    hook._patch_step(wrapper)
    wrapper.update_params(model(x).square().sum())
    hook.remove()
    collector.update()
    assert collector.mean('modules/0/grad_norm') == pytest.approx(
        expected, rel=1e-5)
    assert collector.mean('modules/0/update_ratio') > 0


def test_stats_subset():
    """stats=('grad_norm',): no forward hooks, only gradient norms."""
    model = _toy()
    runner = _mock_runner(model)
    hook = ModuleStatsHook(modules='0', stats=('grad_norm', ))
    hook.before_train(runner)
    collector = Collector('modules/.*')
    hook.before_train_iter(runner, 9)
    assert not model[0]._forward_hooks
    runner.optim_wrapper.update_params(model(torch.randn(4, 3)).sum())
    hook.after_train_iter(runner, 9)
    collector.update()
    assert collector.names() == [
        'modules/0/grad_norm', 'modules/instrument_ms'
    ]
    with pytest.raises(ValueError, match='stats must be'):
        ModuleStatsHook(modules='0', stats=('act', 'typo'))
