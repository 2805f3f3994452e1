"""ModuleStatsHook(optimizer_state=True) forms ``sum(g * m)`` in float64:
the cosines of a bfloat16 model through a real Runner equal a float64
recomputation to 1e-12 (products in bfloat16 are 1e-4 off);
:func:`float64_dots` alone:
``tests/test_module_stats/test_optimizer_state.py``."""
import numpy as np
import torch
from mmengine.registry import MODELS
from mmengine.runner import Runner

from tests.helpers.module_stats import NAMES, module_stats_cfg, scalars
from tests.helpers.toy import ToyBNModel
from tests.test_module_stats.test_module_stats_optimizer import (StateRecorder,
                                                                 reference)


@MODELS.register_module(force=True)
class Bf16Toy(ToyBNModel):
    """ToyBNModel in bfloat16 (parameters, gradients and Adam's state)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.to(torch.bfloat16)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        return super().forward(inputs.to(torch.bfloat16), data_samples, mode)


def test_bfloat16_cosines_equal_a_float64_recomputation(
        tmp_path, clean_mmengine):
    """AdamW on a bfloat16 model: every published norm and cosine equals
    the float64 recomputation from the raw bfloat16 tensors to 1e-12; the
    dot products taken in bfloat16 are 1e-5 to 1e-3 off on the same
    tensors."""
    cfg = module_stats_cfg(
        tmp_path,
        dict(
            stats=('mean', ),
            collect=('timing', ),
            health=dict(on_nonfinite='raise')),
        dict(stats=('grad_norm', ), optimizer_state=True))
    cfg.model = dict(type='Bf16Toy')
    cfg.optim_wrapper.optimizer = dict(type='AdamW', lr=1e-2)
    runner = Runner.from_cfg(cfg)
    recorder = StateRecorder()
    runner.register_hook(recorder)
    runner.train()
    published = scalars(tmp_path)
    worst_bf16 = 0.
    for it in (3, 6):
        for name in NAMES:
            rows = recorder.steps[it][name]
            want = reference(rows)
            key = f'stats/modules/{name}'
            for stat in ('exp_avg_norm', 'exp_avg_cos',
                         'exp_avg_sq_sqrt_norm'):
                np.testing.assert_allclose(
                    published[it][f'{key}/{stat}/mean'],
                    want[stat],
                    rtol=1e-12,
                    err_msg=f'{it} {name} {stat}')
            # the same dot with bfloat16 products
            bf16 = sum(
                float((torch.from_numpy(g).bfloat16() *
                       torch.from_numpy(s['exp_avg']).bfloat16()).sum(
                           dtype=torch.float64)) for g, s in rows)
            exact = sum((g * s['exp_avg']).sum() for g, s in rows)
            worst_bf16 = max(worst_bf16, abs(bf16 / exact - 1))
    assert worst_bf16 > 1e-5
