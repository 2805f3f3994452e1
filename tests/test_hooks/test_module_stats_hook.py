"""ModuleStatsHook: every published module statistic against a float64
recomputation from the raw tensors, in real Runners on 1 and 2 gloo ranks;
the interval logic, argument errors and AMP unscaling on their own."""
import json
import os.path as osp
from contextlib import contextmanager
from unittest.mock import MagicMock, patch

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.hooks import Hook, LoggerHook
from mmengine.model import is_model_wrapper
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import MODELS, OPTIM_WRAPPERS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, Runner
from torch import nn
from torch.utils.checkpoint import checkpoint

from mmstats import Collector, ModuleStatsHook, StatsCollectorHook
from mmstats.hooks.module_tensors import SegmentNorms
from tests.helpers.dist import run_distributed
from tests.helpers.runner import gloo_launch, toy_cfg
from tests.helpers.toy import ToyBNModel

NAMES = ('backbone.stem', 'backbone.layer1', 'backbone.layer1.0', 'head')
MODULES = r'backbone\.(stem|layer1(\.0)?)|head'


class RawRecorder(Hook):
    """Keep, per iteration, the raw outputs of NAMES (forward calls outside
    a backward pass) and the gradients and weights around each optimizer
    step. Its functions run eagerly under torch.compile too."""
    priority = 'VERY_HIGH'

    def __init__(self, freeze=None):
        self.freeze = freeze
        self.acts, self.steps, self.recomputed = {}, {}, set()
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

        @torch.compiler.disable
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
                grads=grads, before=before, after=self._weights())

        optimizer.step = step

    def _weights(self):
        return {
            n:
            [p.detach().double().cpu().numpy().copy() for p in m.parameters()]
            for n, m in self.modules.items()
        }

    def _forward_hook(self, name):

        @torch.compiler.disable
        def hook(module, args, output):
            if not module.training:  # the validation after training
                return
            calls = self.acts.setdefault(self.iter, {})
            if name in calls:  # a checkpoint's recomputation
                self.recomputed.add((self.iter, name))
                return
            calls[name] = output.detach().double().cpu().numpy().copy()

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
           amp=False,
           model=None,
           compile=False,
           hooks=()):
    cfg = toy_cfg(
        work_dir,
        by_epoch=False,
        max_iters=6,
        log_interval=3,
        custom_hooks=[
            dict(
                type='mmstats.StatsCollectorHook',
                stats=STATS,
                collect_outputs=False,
                keep_previous=False,
                on_nonfinite='raise'),
            dict(type='mmstats.ModuleStatsHook', modules=MODULES)
        ])
    cfg.optim_wrapper.accumulative_counts = accumulative_counts
    if amp:
        cfg.optim_wrapper.type = amp
    if model is not None:
        cfg.model = model
    if compile:
        cfg.compile = True  # inductor
    if dist:
        gloo_launch(cfg)
    runner = Runner.from_cfg(cfg)
    recorder = RawRecorder(freeze)
    runner.register_hook(recorder)
    for hook in hooks:
        runner.register_hook(hook)
    runner.train()
    return recorder


STATS = ('num', 'mean', 'std', 'min', 'max')


def _check(scalars, acts, steps, publications, frozen=None, no_step=()):
    """``acts``: {iter: {name: [arrays of all ranks]}}, ``steps``:
    {publication: {name: (grads, before, after) per rank}}; ``no_step``:
    publications whose optimizer step was skipped (AMP overflow). Module
    statistics are published at ``publications`` and nowhere else."""
    assert sorted(s for s, r in scalars.items() if any(
        'stats/modules/' in k for k in r)) == sorted(publications)
    for it in publications:
        record = scalars[it]
        for name in NAMES:
            values = np.concatenate([a.ravel() for a in acts[it][name]])
            key = f'stats/modules/{name}/act'
            assert record[f'{key}/num'] == values.size, (it, name)
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
            if name == frozen or it in no_step:
                assert f'stats/modules/{name}/grad_norm/mean' not in record
                assert f'stats/modules/{name}/update_ratio/mean' not in record
                continue
            grad = [_norm(g) for g, _, _ in per_rank]
            ratio = [
                _norm([a - b for a, b in zip(after, before)]) / _norm(before)
                for _, before, after in per_rank
            ]
            assert record[f'stats/modules/{name}/grad_norm/num'] == len(grad)
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


def _one_rank(recorder, publications, step_of=None):
    """``acts`` and ``steps`` for :func:`_check` of a one-process run
    (``step_of``: {publication: iteration of the step it shows})."""
    step_of = step_of or {it: it for it in publications}
    acts = {
        it: {
            n: [a]
            for n, a in recorder.acts[it].items()
        }
        for it in publications
    }
    steps = {
        it: {
            n: [v]
            for n, v in _step_record(recorder, step_of[it]).items()
        }
        for it in publications
    }
    return acts, steps


def test_real_runner_exact(tmp_path, clean_mmengine):
    recorder = _train(tmp_path)
    _check(_scalars(tmp_path), *_one_rank(recorder, (3, 6)), (3, 6))
    assert sorted(recorder.steps) == [1, 2, 3, 4, 5, 6]


def test_frozen_module_and_accumulation(tmp_path, clean_mmengine):
    """Steps at iterations 2, 4, 6; publications at 3 and 6 show the
    gradients of the steps at 2 and 6. The frozen stem has no grads."""
    recorder = _train(tmp_path, freeze='backbone.stem', accumulative_counts=2)
    assert sorted(recorder.steps) == [2, 4, 6]
    _check(
        _scalars(tmp_path),
        *_one_rank(recorder, (3, 6), step_of={
            3: 2,
            6: 6
        }), (3, 6),
        frozen='backbone.stem')


@MODELS.register_module(force=True)
class CheckpointedToy(ToyBNModel):
    """ToyBNModel whose ``backbone.layer1`` runs under
    ``torch.utils.checkpoint`` (``with_cp=True`` in OpenMMLab backbones)."""

    def __init__(self, use_reentrant: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.use_reentrant = use_reentrant

    def forward(self, inputs, data_samples=None, mode='tensor'):
        feats = checkpoint(
            self.backbone.layer1,
            self.backbone.stem(inputs),
            use_reentrant=self.use_reentrant).mean(dim=(2, 3))
        logits = self.head(feats)
        if mode == 'loss':
            return dict(loss=F.cross_entropy(logits, data_samples['gt_label']))
        if mode == 'tensor':
            return logits
        return [
            dict(pred=p, gt=g)
            for p, g in zip(logits.argmax(1), data_samples['gt_label'])
        ]


@pytest.mark.parametrize('use_reentrant', [False, True])
def test_activation_checkpointing(tmp_path, clean_mmengine, use_reentrant):
    """The recomputation in backward fires layer1's forward hooks again:
    its outputs still count once."""
    recorder = _train(
        tmp_path,
        model=dict(type='CheckpointedToy', use_reentrant=use_reentrant))
    assert {(it, 'backbone.layer1.0') for it in range(1, 7)} <= \
        recorder.recomputed
    _check(_scalars(tmp_path), *_one_rank(recorder, (3, 6)), (3, 6))


@OPTIM_WRAPPERS.register_module(force=True)
class CpuAmpOptimWrapper(AmpOptimWrapper):
    """mmengine's AmpOptimWrapper (CUDA-only) with a CPU GradScaler of loss
    scale ``2**70`` and bfloat16 autocast."""

    def __init__(self, **kwargs) -> None:
        with patch(
                'mmengine.optim.optimizer.amp_optimizer_wrapper.'
                'is_cuda_available',
                return_value=True):
            super().__init__(**kwargs)
        self.loss_scaler = torch.amp.GradScaler('cpu', init_scale=2.**70)

    @contextmanager
    def optim_context(self, model):
        with OptimWrapper.optim_context(self, model), torch.autocast(
                'cpu', dtype=torch.bfloat16):
            yield


class Overflow(Hook):
    """Make the logits infinite on ``iterations``: the loss and every
    gradient are NaN, the GradScaler skips the step. Registered after
    ModuleStatsHook's forward hooks, which see the finite logits."""
    priority = 'LOWEST'

    def __init__(self, iterations):
        self.iterations = iterations

    def before_train(self, runner):
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        model.head.register_forward_hook(self._hook)
        self.iter = 0

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.iter = runner.iter + 1

    def _hook(self, module, args, output):
        if module.training and self.iter in self.iterations:
            return output * float('inf')


def test_amp_overflow_and_huge_loss_scale(tmp_path, clean_mmengine):
    """bf16 autocast + GradScaler at 2**70 (float32 squares of the scaled
    gradients overflow): the norms are of the unscaled gradients; the steps
    skipped at iterations 2 and 6 (6 publishes) give no grad_norm or
    update_ratio, do not trip on_nonfinite='raise', and are counted."""
    recorder = _train(
        tmp_path, amp='CpuAmpOptimWrapper', hooks=[Overflow((2, 6))])
    assert sorted(recorder.steps) == [1, 3, 4, 5]  # 2 and 6 skipped
    scalars = _scalars(tmp_path)
    acts, steps = _one_rank(recorder, (3, ))
    steps[6] = {n: [v] for n, v in _step_record(recorder, 5).items()}
    acts[6] = {n: [a] for n, a in recorder.acts[6].items()}
    _check(scalars, acts, steps, (3, 6), no_step=(6, ))
    assert scalars[3]['stats/modules/amp_skipped_steps/mean'] == 1
    assert scalars[6]['stats/modules/amp_skipped_steps/mean'] == 1


def _dist_worker(rank, world_size, work_dir):
    recorder = _train(osp.join(work_dir, str(rank)), dist=True)
    return dict(
        acts={it: recorder.acts[it]
              for it in (3, 6)},
        steps={it: _step_record(recorder, it)
               for it in (3, 6)})


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


def test_hooks_registered_once_and_armed_only_when_published():
    """Forward and step hooks exist from before_train (before a compile
    would trace them) to after_train, and report only on the iterations
    that publish."""
    model = _toy()
    runner = _mock_runner(model)
    optimizer = runner.optim_wrapper.optimizer
    hook = ModuleStatsHook(modules=r'0|2')
    assert not model[0]._forward_hooks  # nothing live before a run
    hook.before_train(runner)
    assert sorted(hook.targets) == ['0', '2']
    collector = Collector('modules/.*', keep_previous=False)
    published = []
    for batch_idx in range(23):
        assert len(model[0]._forward_hooks) == len(model[2]._forward_hooks)
        assert len(model[0]._forward_hooks) == 1
        assert len(optimizer._optimizer_step_pre_hooks) == 1
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
    assert not optimizer._optimizer_step_pre_hooks
    assert not optimizer._optimizer_step_post_hooks


def test_bad_modules_fail_early():
    with pytest.raises(ValueError, match='modules=.*valid regular'):
        ModuleStatsHook(modules='backbone[')
    with pytest.raises(TypeError, match='modules must be'):
        ModuleStatsHook(modules=None)
    hook = ModuleStatsHook(modules='backbone')
    with pytest.raises(ValueError, match="modules='backbone' matches no"):
        hook.before_train(_mock_runner(_toy()))


def test_norm_index_stays_bounded():
    """LayerDrop/MoE: the set of parameters with a gradient changes every
    iteration; the cached index tensors do not grow with it."""
    norms = SegmentNorms(3, max_layouts=4)
    tensors = [torch.full((2, ), float(i)) for i in range(6)]
    for step in range(50):
        keep = [i for i in range(6) if (step >> (i % 5)) & 1 or i == 5]
        result = norms([tensors[i] for i in keep], [i % 3 for i in keep])
        expected = [
            np.sqrt(sum(2 * float(i)**2 for i in keep if i % 3 == s))
            for s in range(3)
        ]
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12)
        assert len(norms._index) <= 4


def test_norms_of_huge_gradients_are_finite():
    """float64 accumulation: elements near float32's limit (a gradient
    still multiplied by a loss scale of 2**127) give a finite norm."""
    big = torch.full((1000, ), 2.**127)
    result = SegmentNorms(1)([big, big], [0, 0])
    assert torch.isfinite(result).all()
    assert result.item() == pytest.approx(2.**127 * np.sqrt(2000), rel=1e-12)


def test_stats_subset():
    """stats=('grad_norm',): no forward hooks, only gradient norms."""
    model = _toy()
    runner = _mock_runner(model)
    hook = ModuleStatsHook(modules='0', stats=('grad_norm', ))
    hook.before_train(runner)
    collector = Collector('modules/.*')
    hook.before_train_iter(runner, 9)
    assert not model[0]._forward_hooks and hook._acts is None
    runner.optim_wrapper.update_params(model(torch.randn(4, 3)).sum())
    hook.after_train_iter(runner, 9)
    collector.update()
    assert collector.names() == [
        'modules/0/grad_norm', 'modules/instrument_ms'
    ]
    with pytest.raises(ValueError, match='stats must be'):
        ModuleStatsHook(modules='0', stats=('act', 'typo'))
