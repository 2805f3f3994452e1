"""ModuleStatsHook with a fused optimizer under a GradScaler (real Runner,
CPU AMP): a fused ``step`` unscales inside its kernel, so the gradients a
step pre-hook sees are still multiplied by the loss scale. No published
``grad_norm`` may come from them: each one that is published equals the
unscaled norm of its step (today none is published for fused optimizers;
the non-fused control shows the test sees grad_norm where there is one)."""
import math

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.runner import Runner

import tests.helpers.amp  # noqa: F401  (registers CpuBf16AmpOptimWrapper)
from mmstats.utils.torch_compat import register_step_hooks
from tests.helpers.runner import read_scalars, toy_cfg
from tests.helpers.torch_versions import CPU_GRAD_SCALER

try:
    from torch.amp.grad_scaler import OptState
except ImportError:  # torch < 2.3 (whose tests are skipped)
    from torch.cuda.amp.grad_scaler import OptState

pytestmark = CPU_GRAD_SCALER

SCALE = 2.**16  # scaled norms would be 65536 times too large
HEAD = 'stats/modules/head/grad_norm'


@ROOT_HOOKS.register_module(force=True)
class UnscaledGradNormHook(Hook):
    """The head's unscaled gradient norm at every optimizer step."""
    priority = 'HIGHEST'

    def __init__(self) -> None:
        self.norms = {}

    def before_train(self, runner) -> None:
        head = runner.model.head
        scaler = runner.optim_wrapper.loss_scaler
        optimizer = runner.optim_wrapper.optimizer

        def pre(*_):
            grads = torch.cat(
                [p.grad.double().flatten() for p in head.parameters()])
            # GradScaler unscales before a plain step; a fused one
            # unscales inside its kernel (the gradients are scaled here)
            state = scaler._per_optimizer_states[id(optimizer)]['stage']
            scale = 1. if state is OptState.UNSCALED else scaler.get_scale()
            self.norms[runner.iter] = float(grads.norm()) / scale

        register_step_hooks(optimizer, pre, lambda *_: None)


@pytest.mark.parametrize('optimizer, fused', [('SGD', True), ('Adam', True),
                                              ('SGD', False)])
def test_no_grad_norm_from_scaled_gradients(tmp_path, clean_mmengine,
                                            optimizer, fused):
    cfg = toy_cfg(str(tmp_path), by_epoch=False, max_iters=4, log_interval=2)
    cfg.optim_wrapper = dict(
        type='CpuBf16AmpOptimWrapper',
        init_scale=SCALE,
        optimizer=dict(type=optimizer, lr=0.01, fused=fused))
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook', collect=('outputs', )),
        dict(type='mmstats.ModuleStatsHook', modules='head'),
        dict(type='UnscaledGradNormHook'),
    ]
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.train_cfg.pop('val_interval', None)
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.optim_wrapper.optimizer.defaults['fused'] is fused
    norms = [h for h in runner.hooks
             if isinstance(h, UnscaledGradNormHook)][0].norms
    assert sorted(norms) == [0, 1, 2, 3]  # every step really happened
    published = read_scalars(runner)
    seen = 0
    for step, scalars in published.items():
        for key in [
                f'{HEAD}/{stat}' for stat in ('mean', 'min', 'max')
                if f'{HEAD}/{stat}' in scalars
        ]:
            value = scalars[key]
            assert math.isfinite(value), (key, value)
            # the published iteration's own unscaled norm: never scaled
            assert value == pytest.approx(
                norms[step - 1], rel=1e-4), (key, value, norms[step - 1],
                                             norms[step - 1] * SCALE)
            seen += 1
    if not fused:  # the control: grad_norm is published and checked
        assert seen >= 2
