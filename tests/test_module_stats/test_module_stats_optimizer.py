"""ModuleStatsHook(optimizer_state=True): every published optimizer-state
number against a float64 recomputation from the raw optimizer state and
gradients right after the step, through real Runners (Adam, AdamW,
SGD with and without momentum, a frozen module; 1 and 2 gloo ranks), for
exactly the publication iterations; absent states publish no name.

The sharded cells (FSDP1 both layouts, FSDP2) are in
``tests/test_sharded_optimizer_state.py``."""
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmstats import ModuleStatsHook
from mmstats.utils.torch_compat import register_step_hooks
from tests.helpers.dist import run_distributed
from tests.helpers.module_stats import (NAMES, module_stats_cfg, named_targets,
                                        scalars)
from tests.helpers.runner import gloo_launch

PUBLISHED = (3, 6)
OPTIMIZERS = {
    'Adam': dict(type='Adam', lr=1e-2),
    'AdamW': dict(type='AdamW', lr=1e-2, weight_decay=0.1),
    'SGD-momentum': dict(type='SGD', lr=0.1, momentum=0.9),
    'SGD': dict(type='SGD', lr=0.1),
}
#: the names each optimizer's state gives
EXPECTED = {
    'Adam': ('exp_avg_norm', 'exp_avg_cos', 'exp_avg_sq_sqrt_norm'),
    'AdamW': ('exp_avg_norm', 'exp_avg_cos', 'exp_avg_sq_sqrt_norm'),
    'SGD-momentum': ('momentum_buffer_norm', 'momentum_buffer_cos'),
    'SGD': (),
}
ALL = ('exp_avg_norm', 'exp_avg_cos', 'exp_avg_sq_sqrt_norm',
       'momentum_buffer_norm', 'momentum_buffer_cos')


class StateRecorder(Hook):
    """After every optimizer step: per module of NAMES, the gradients and
    the optimizer's state tensors of its parameters that have a gradient
    (float64 copies)."""
    priority = 'VERY_HIGH'

    def __init__(self, freeze=None):
        self.freeze = freeze
        self.steps = {}

    def before_train(self, runner):
        self.modules = named_targets(runner, self.freeze)
        optimizer = runner.optim_wrapper.optimizer
        register_step_hooks(optimizer, lambda *_: None,
                            lambda *_: self._record(runner, optimizer))

    def _record(self, runner, optimizer):
        record = {}
        for name, module in self.modules.items():
            rows = []
            for p in module.parameters():
                if p.grad is None:
                    continue
                state = {
                    k: v.detach().double().numpy().copy()
                    for k, v in optimizer.state[p].items()
                    if isinstance(v, torch.Tensor) and v.shape == p.shape
                }
                rows.append((p.grad.double().numpy().copy(), state))
            record[name] = rows
        self.steps[runner.iter + 1] = record


def reference(rows):
    """The published numbers of one module, recomputed from its raw
    (gradient, state) pairs."""
    out = {}
    for state in ('exp_avg', 'momentum_buffer'):
        pairs = [(g, s[state]) for g, s in rows if state in s]
        if not pairs:
            continue
        squares = sum((m**2).sum() for _, m in pairs)
        out[f'{state}_norm'] = np.sqrt(squares)
        out[f'{state}_cos'] = sum(
            (g * m).sum() for g, m in pairs) / np.sqrt(squares * sum(
                (g**2).sum() for g, _ in pairs))
    second = [s['exp_avg_sq'] for _, s in rows if 'exp_avg_sq' in s]
    if second:
        out['exp_avg_sq_sqrt_norm'] = np.sqrt(sum(v.sum() for v in second))
    return out


def train(work_dir, optimizer, dist=False, freeze=None, accumulative_counts=1):
    cfg = module_stats_cfg(
        work_dir,
        dict(
            stats=('num', 'mean', 'min', 'max'),
            collect=('timing', ),
            health=dict(on_nonfinite='raise')),
        dict(stats=('grad_norm', ), optimizer_state=True))
    cfg.optim_wrapper.optimizer = OPTIMIZERS[optimizer]
    cfg.optim_wrapper.accumulative_counts = accumulative_counts
    if dist:
        gloo_launch(cfg)
    runner = Runner.from_cfg(cfg)
    recorder = StateRecorder(freeze)
    runner.register_hook(recorder)
    runner.train()
    return recorder.steps


def check(published, steps_per_rank, optimizer, frozen=None, step_of=None):
    """``steps_per_rank``: per rank, {iteration: {name: rows}};
    ``step_of``: {publication: iteration of the step it shows}."""
    step_of = step_of or {it: it for it in PUBLISHED}
    with_state = sorted(it for it, record in published.items() if any(
        '/exp_avg' in k or '/momentum_buffer' in k for k in record))
    assert with_state == (list(PUBLISHED) if EXPECTED[optimizer] else [])
    for it in PUBLISHED:
        record = published[it]
        for name in NAMES:
            key = f'stats/modules/{name}'
            expected = () if name == frozen else EXPECTED[optimizer]
            found = {stat for stat in ALL if f'{key}/{stat}/mean' in record}
            assert found == set(expected), (it, name, found)
            refs = [
                reference(steps[step_of[it]][name]) for steps in steps_per_rank
            ]
            for stat in expected:
                # one value per publication, the same on every rank: its
                # value alone (a spread of it could not vary)
                for spread in ('num', 'std', 'min', 'max'):
                    assert f'{key}/{stat}/{spread}' not in record
                # every rank's own recomputation gives the same number
                for ref in refs[1:]:
                    np.testing.assert_allclose(
                        ref[stat], refs[0][stat], rtol=1e-9)
                for agg in ('mean', ):
                    np.testing.assert_allclose(
                        record[f'{key}/{stat}/{agg}'],
                        refs[0][stat],
                        rtol=1e-6,
                        err_msg=f'{it} {name} {stat} {agg}')
            if expected:  # not a degenerate case
                cos = refs[0][expected[1]]
                assert -1 <= cos <= 1 and abs(cos) > 1e-3


@pytest.mark.parametrize('optimizer', list(OPTIMIZERS))
def test_one_process(tmp_path, clean_mmengine, optimizer):
    steps = train(tmp_path, optimizer)
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]
    check(scalars(tmp_path), [steps], optimizer)


def test_frozen_module_has_no_state(tmp_path, clean_mmengine):
    steps = train(tmp_path, 'AdamW', freeze='backbone.stem')
    check(scalars(tmp_path), [steps], 'AdamW', frozen='backbone.stem')


def test_accumulation_shows_the_last_step(tmp_path, clean_mmengine):
    """accumulative_counts=2: steps at 2, 4, 6; the publications after 3
    and 6 show the state after the steps at 2 and 6."""
    steps = train(tmp_path, 'AdamW', accumulative_counts=2)
    assert sorted(steps) == [2, 4, 6]
    check(scalars(tmp_path), [steps], 'AdamW', step_of={3: 2, 6: 6})


def _worker(rank, world_size, work_dir, optimizer):
    steps = train(osp.join(work_dir, str(rank)), optimizer, dist=True)
    return {it: steps[it] for it in PUBLISHED}


@pytest.mark.parametrize('optimizer', ['AdamW', 'SGD-momentum'])
def test_two_gloo_ranks(tmp_path, optimizer):
    ranks = run_distributed(_worker, 2, str(tmp_path), optimizer)
    check(scalars(osp.join(tmp_path, '0')), ranks, optimizer)


def test_argument_is_checked():
    with pytest.raises(TypeError, match='optimizer_state must be True or'):
        ModuleStatsHook(modules='head', optimizer_state=1)
    assert ModuleStatsHook(modules='head').optimizer_state is False


class DeepSpeedStrategy:
    """Stands in for mmengine's DeepSpeedStrategy: the hook looks at the
    strategy's class name."""


def test_deepspeed_is_refused_at_before_run():
    from types import SimpleNamespace
    hook = ModuleStatsHook(modules='head', optimizer_state=True)
    with pytest.raises(
            RuntimeError,
            match='optimizer_state=True is not supported under '
            'DeepSpeedStrategy.*set optimizer_state=False'):
        hook.before_run(SimpleNamespace(strategy=DeepSpeedStrategy()))
    # without the option, DeepSpeed passes this check
    ModuleStatsHook(modules='head').before_run(
        SimpleNamespace(strategy=DeepSpeedStrategy(), hooks=[]))
