"""The compatibility matrix: StatsCollectorHook + ModuleStatsHook +
PreciseBNHook through real Runners in the configurations users launch.

{eager, ``compile=True``} x {fp32, bf16 autocast with a GradScaler (CPU)} x
{1, 2 gloo processes}, plus gradient accumulation, activation checkpointing,
a frozen stage, GradScaler overflow steps (with AMP the loss scale is 2**120
and, at iterations 3 and 5, inf: the gradients overflow and GradScaler
skips those steps, one of them on a publication iteration) and an
iteration-based loop whose length (7) is not a multiple of the interval
(3). Every number in scalars.json is checked against a float64
recomputation from the raw values of exactly the iterations it covers:
publications after iterations 3, 6 and 7. The CUDA fp16 cells run in
``tests/cuda`` (``make test-gpu``).
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.registry import MODELS
from mmengine.runner import Runner
from torch.utils.checkpoint import checkpoint

import tests.helpers.amp  # noqa: F401  (registers CpuBf16AmpOptimWrapper)
from mmstats.utils.torch_compat import register_step_hooks
from tests.helpers.dist import run_distributed
from tests.helpers.runner import gloo_launch, read_scalars, toy_cfg
from tests.helpers.torch_versions import COMPILE, CPU_GRAD_SCALER
from tests.helpers.toy import ToyBNModel, ToyDataset

MAX_ITERS = 7
INTERVAL = 3
PUBLISHED = (3, 6, 7)  # 1-based iterations after which stats are published
SAMPLES = 64  # the whole dataset: precise BN reads every sample once
HEAD = 'modules/head'
LAYER = 'modules/backbone.layer1'  # checkpointed with with_cp
OVERFLOW = (2, 4)  # 0-based iterations whose scaled loss overflows


@MODELS.register_module(force=True)
class MatrixToyModel(ToyBNModel):
    """The toy BN model; ``with_cp`` recomputes the backbone in backward
    (``torch.utils.checkpoint``, non-reentrant), ``frozen_stem`` freezes the
    stem (no gradient, BN in eval mode, like ``frozen_stages``)."""

    def __init__(self, with_cp=False, frozen_stem=False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.with_cp = with_cp
        self.frozen_stem = frozen_stem
        if frozen_stem:
            self.backbone.stem.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen_stem:
            self.backbone.stem.eval()
        return self

    def forward(self, inputs, data_samples=None, mode='tensor'):
        if self.with_cp and self.training:
            feats = checkpoint(self.backbone, inputs, use_reentrant=False)
        else:
            feats = self.backbone(inputs)
        logits = self.head(feats.mean(dim=(2, 3)))
        if mode == 'tensor':
            return logits
        if mode == 'loss':
            return dict(
                loss=F.cross_entropy(logits.float(), data_samples['gt_label']))
        return [
            dict(pred=p, gt=g)
            for p, g in zip(logits.argmax(1), data_samples['gt_label'])
        ]


@torch.compiler.disable
def _keep(recorder, store: dict, runner, tensor: torch.Tensor) -> None:
    if recorder.recording:  # not in precise BN's forwards
        store[runner.iter] = tensor.detach().double().flatten().clone()


@ROOT_HOOKS.register_module(force=True)
class MatrixRecorderHook(Hook):
    """The raw values, per iteration: the loss, the head's output (a forward
    hook registered before compilation; a recomputation overwrites the same
    entry), and around every optimizer step that really happens (not the
    ones GradScaler skips) the head's unscaled gradient norm, its weights
    before and after."""
    priority = 'HIGHEST'  # after_train_iter before PreciseBNHook's

    def __init__(self) -> None:
        self.losses, self.steps = {}, {}
        self.acts = {HEAD: {}, LAYER: {}}
        self.recording = False

    def before_train(self, runner) -> None:
        model = runner.model.module if hasattr(runner.model,
                                               'module') else runner.model
        self.head = model.head
        for key, module in ((HEAD, model.head), (LAYER,
                                                 model.backbone.layer1)):
            module.register_forward_hook(lambda m, a, out, acts=self.acts[key]:
                                         _keep(self, acts, runner, out))
        optimizer = runner.optim_wrapper.optimizer
        register_step_hooks(optimizer, lambda *_: self._pre(runner),
                            lambda *_: self._post(runner))

    def _params(self):
        return [p.detach().double() for p in self.head.parameters()]

    def _pre(self, runner) -> None:
        grads = [p.grad.double() for p in self.head.parameters()]
        self.steps[runner.iter] = dict(
            grad_norm=float(torch.cat([g.flatten() for g in grads]).norm()),
            before=[p.clone() for p in self._params()])

    def _post(self, runner) -> None:
        step = self.steps[runner.iter]
        after = self._params()
        flat = lambda ts: torch.cat([t.flatten() for t in ts])  # noqa: E731
        step['weight_norm'] = float(flat(after).norm())
        step['update_ratio'] = float(
            (flat(after) - flat(step['before'])).norm() /
            flat(step['before']).norm())
        del step['before']

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.recording = True
        scaler = getattr(runner.optim_wrapper, 'loss_scaler', None)
        if scaler is None:
            return
        scale = math.inf if runner.iter in OVERFLOW else 2.**120
        if scaler._scale is None:  # created at the first scale()
            scaler._init_scale = scale
        else:
            scaler._scale.fill_(scale)

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        self.recording = False
        self.losses[runner.iter] = float(outputs['loss'].detach().double())


def _train(work_dir,
           compiled,
           amp,
           world=1,
           accumulate=1,
           with_cp=False,
           frozen_stem=False):
    cfg = toy_cfg(
        work_dir,
        by_epoch=False,
        num_samples=SAMPLES,
        batch_size=8,
        max_iters=MAX_ITERS,
        log_interval=INTERVAL)
    cfg.model = dict(
        type='MatrixToyModel', with_cp=with_cp, frozen_stem=frozen_stem)
    cfg.train_dataloader.dataset = dict(type='ToyDataset', num_samples=SAMPLES)
    optim = dict(type='SGD', lr=0.05, momentum=0.9)
    cfg.optim_wrapper = dict(
        type='OptimWrapper', optimizer=optim, accumulative_counts=accumulate)
    if amp:
        cfg.optim_wrapper.update(
            type='CpuBf16AmpOptimWrapper', init_scale=2.**120)
    cfg.custom_hooks = [
        dict(
            type='mmstats.PreciseBNHook',
            num_samples=SAMPLES,
            interval=100,
            progress=False),
        dict(
            type='mmstats.StatsCollectorHook',
            stats=('num', 'mean', 'min', 'max'),
            collect=('outputs', )),
        dict(type='mmstats.ModuleStatsHook', modules=r'head|backbone\.layer1'),
        dict(type='MatrixRecorderHook'),
    ]
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.train_cfg.pop('val_interval', None)
    if compiled:
        cfg.compile = True
    if world > 1:
        gloo_launch(cfg)
    runner = Runner.from_cfg(cfg)
    runner.train()
    recorder = [h for h in runner.hooks
                if isinstance(h, MatrixRecorderHook)][0]
    model = runner.model.module if world > 1 else runner.model
    bn = model.backbone.stem.bn
    published = read_scalars(runner, missing_ok=True)  # rank 0 writes it
    return dict(
        published=published,
        losses=recorder.losses,
        acts={
            key: {
                it: v.numpy()
                for it, v in acts.items()
            }
            for key, acts in recorder.acts.items()
        },
        steps=recorder.steps,
        bn=(bn.running_mean.double().numpy(), bn.running_var.double().numpy()),
        stem_weight=model.backbone.stem.conv.weight.detach().double().numpy())


def _check(ranks, accumulate=1, frozen_stem=False, amp=False):
    """Every published number against the raw values it covers."""
    first = ranks[0]['published']
    start = 0
    for end in PUBLISHED:
        scalars = first[end]
        losses = [r['losses'][it] for r in ranks for it in range(start, end)]
        assert scalars['stats/loss/num'] == len(losses)
        assert scalars['stats/loss/mean'] == pytest.approx(
            np.mean(losses), rel=1e-9, abs=1e-12)
        assert scalars['stats/loss/min'] == pytest.approx(min(losses))
        assert scalars['stats/loss/max'] == pytest.approx(max(losses))
        # ModuleStatsHook: the instrumented iteration is the publication's;
        # every output element once (also when recomputed in backward)
        for key in (HEAD, LAYER):
            acts = np.concatenate([r['acts'][key][end - 1] for r in ranks])
            assert scalars[f'stats/{key}/act/num'] == acts.size
            assert scalars[f'stats/{key}/act/mean'] == pytest.approx(
                acts.mean(), rel=1e-6, abs=1e-9)
            assert scalars[f'stats/{key}/act/max'] == pytest.approx(
                acts.max(), rel=1e-6)
        # the last optimizer step up to the publication that really stepped
        stepped = [it for it in ranks[0]['steps'] if start <= it < end]
        last = max(stepped, default=None)
        if last is not None and last > end - 1 - accumulate:
            for stat in ('grad_norm', 'weight_norm', 'update_ratio'):
                ref = [r['steps'][last][stat] for r in ranks]
                key = f'stats/{HEAD}/{stat}/mean'
                assert scalars[key] == pytest.approx(np.mean(ref), rel=1e-5)
                assert math.isfinite(scalars[key])
        else:  # a step GradScaler skipped: nothing, never a stale value
            assert f'stats/{HEAD}/grad_norm/mean' not in scalars
        start = end
    # precise BN: the stem's BN over every sample (its input does not
    # depend on other BN layers) with the final weights (its forwards run
    # under the training's autocast: bf16 convolutions with AMP)
    rtol = 1e-2 if amp else 1e-4
    if not frozen_stem:
        images = ToyDataset(num_samples=SAMPLES).images.double()
        weight = torch.from_numpy(ranks[0]['stem_weight'])
        out = F.conv2d(images, weight, padding=1)
        mean = out.mean(dim=(0, 2, 3)).numpy()
        var = out.var(dim=(0, 2, 3), unbiased=False).numpy()
        for r in ranks:
            np.testing.assert_allclose(
                r['bn'][0], mean, rtol=rtol, atol=1e-3 if amp else 1e-6)
            np.testing.assert_allclose(r['bn'][1], var, rtol=rtol, atol=1e-6)


def _rank_train(rank, world, work_dir, *args):
    torch.manual_seed(rank)
    return _train(f'{work_dir}/r{rank}', *args, world=world)


CELLS = [  # (compile, amp)
    (False, False),
    pytest.param(False, True, marks=CPU_GRAD_SCALER),
    pytest.param(True, False, marks=COMPILE),
    pytest.param(True, True, marks=[COMPILE, CPU_GRAD_SCALER]),
]


@pytest.mark.parametrize('compiled,amp', CELLS)
def test_one_process(tmp_path, clean_mmengine, compiled, amp):
    if compiled:
        import torch._dynamo
        torch._dynamo.reset()
    ranks = [_train(tmp_path, compiled, amp)]
    if amp:  # GradScaler skipped the overflow steps
        assert not set(OVERFLOW) & set(ranks[0]['steps'])
    _check(ranks, amp=amp)


@pytest.mark.parametrize('compiled,amp', CELLS)
def test_two_gloo_processes(tmp_path, compiled, amp):
    _check(
        run_distributed(
            _rank_train, 2, str(tmp_path), compiled, amp, timeout=600),
        amp=amp)


def test_gradient_accumulation(tmp_path, clean_mmengine):
    _check([_train(tmp_path, False, False, accumulate=2)], accumulate=2)


@pytest.mark.parametrize('compiled',
                         [False, pytest.param(True, marks=COMPILE)])
def test_activation_checkpointing_counts_each_output_once(
        tmp_path, clean_mmengine, compiled):
    if compiled:
        import torch._dynamo
        torch._dynamo.reset()
    _check([_train(tmp_path, compiled, False, with_cp=True)])


def test_a_frozen_stage(tmp_path, clean_mmengine):
    _check([_train(tmp_path, False, False, frozen_stem=True)],
           frozen_stem=True)
