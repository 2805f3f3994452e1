"""ModuleStatsHook test pieces: a recorder of the raw tensors, a real-Runner
run of the toy model with both hooks, the check of every published module
statistic against a float64 recomputation, and the variants (checkpointed
model, CPU AMP wrapper, forced overflow, compile counter)."""
import json
import os
import os.path as osp
from contextlib import contextmanager
from unittest.mock import patch

import numpy as np
import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import MODELS, OPTIM_WRAPPERS
from mmengine.runner import Runner
from torch._dynamo.utils import counters
from torch.utils.checkpoint import checkpoint

from .runner import gloo_launch, toy_cfg
from .toy import ToyBNModel

NAMES = ('backbone.stem', 'backbone.layer1', 'backbone.layer1.0', 'head')
MODULES = r'backbone\.(stem|layer1(\.0)?)|head'


def named_targets(runner, freeze=None) -> dict:
    """The modules of NAMES in ``runner``'s (unwrapped) model, by name;
    module ``freeze``, if given, made to need no gradient."""
    model = runner.model.module if is_model_wrapper(
        runner.model) else runner.model
    modules = {n: m for n, m in model.named_modules() if n in NAMES}
    if freeze:
        modules[freeze].requires_grad_(False)
    return modules


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
        self.modules = named_targets(runner, self.freeze)
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


def norm(arrays):
    return np.sqrt(sum((a**2).sum() for a in arrays))


def scalars(work_dir):
    path = [
        osp.join(work_dir, d, 'vis_data', 'scalars.json')
        for d in sorted(os.listdir(work_dir))
        if osp.isdir(osp.join(work_dir, d, 'vis_data'))
    ][-1]
    merged = {}
    for line in open(path):
        record = json.loads(line)
        merged.setdefault(record['step'], {}).update(record)
    return merged


def module_stats_cfg(work_dir, collector: dict, module: dict):
    """The toy model for 6 iterations with publications after 3 and 6:
    StatsCollectorHook(``**collector``) and ModuleStatsHook of ``MODULES``
    (``**module``)."""
    return toy_cfg(
        work_dir,
        by_epoch=False,
        max_iters=6,
        log_interval=3,
        custom_hooks=[
            dict(type='mmstats.StatsCollectorHook', **collector),
            dict(type='mmstats.ModuleStatsHook', modules=MODULES, **module)
        ])


def train(work_dir,
          dist=False,
          freeze=None,
          accumulative_counts=1,
          amp=False,
          model=None,
          compile=False,
          hooks=()):
    cfg = module_stats_cfg(
        work_dir,
        dict(
            stats=STATS,
            collect=('timing', ),
            keep_previous=False,
            health=dict(on_nonfinite='raise')), {})
    cfg.optim_wrapper.accumulative_counts = accumulative_counts
    if amp:
        cfg.optim_wrapper.type = amp
    if model is not None:
        cfg.model = model
    if compile:
        cfg.compile = compile  # True: inductor
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


def check(scalars, acts, steps, publications, frozen=None, no_step=()):
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
            weight = [norm(after) for _, _, after in per_rank]
            np.testing.assert_allclose(
                record[f'stats/modules/{name}/weight_norm/mean'],
                np.mean(weight),
                rtol=1e-6)
            if name == frozen or it in no_step:
                assert f'stats/modules/{name}/grad_norm/mean' not in record
                assert f'stats/modules/{name}/update_ratio/mean' not in record
                continue
            grad = [norm(g) for g, _, _ in per_rank]
            ratio = [
                norm([a - b for a, b in zip(after, before)]) / norm(before)
                for _, before, after in per_rank
            ]
            # one value per publication, the same on every rank: its value
            # alone is published (a spread of it could not vary)
            np.testing.assert_allclose(grad, grad[0], rtol=1e-6)
            np.testing.assert_allclose(weight, weight[0], rtol=1e-6)
            np.testing.assert_allclose(
                record[f'stats/modules/{name}/grad_norm/mean'],
                np.mean(grad),
                rtol=1e-6)
            for what in ('grad_norm', 'weight_norm', 'update_ratio'):
                for stat in ('num', 'std', 'min', 'max'):
                    assert (f'stats/modules/{name}/{what}/{stat}'
                            not in record), (it, name, what, stat)
            np.testing.assert_allclose(
                record[f'stats/modules/{name}/update_ratio/mean'],
                np.mean(ratio),
                rtol=1e-6)
            assert ratio[0] > 0
        assert record['stats/modules/instrument_ms/mean'] > 0


def step_record(recorder, step_iter):
    s = recorder.steps[step_iter]
    return {n: (s['grads'][n], s['before'][n], s['after'][n]) for n in NAMES}


def one_rank(recorder, publications, step_of=None):
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
            for n, v in step_record(recorder, step_of[it]).items()
        }
        for it in publications
    }
    return acts, steps


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


class CountGraphs(Hook):
    """After each iteration, the number of graphs dynamo has compiled;
    after the warm-up iterations, any recompilation raises."""
    priority = 'LOWEST'

    def __init__(self, warmup):
        self.warmup = warmup
        self.graphs = {}

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.graphs[runner.iter + 1] = counters['stats']['unique_graphs']
        if runner.iter + 1 == self.warmup:
            torch._dynamo.config.error_on_recompile = True


def step_hooks(optimizer: torch.optim.Optimizer) -> int:
    """How many step interceptions ``optimizer`` has: its step pre hooks,
    or the wrap of its ``step`` that replaces them where the class's
    ``step`` runs no hooks (torch 2.1, ``register_step_hooks``)."""
    wrapped = getattr(vars(optimizer).get('step'), '__wrapped__', None)
    return len(optimizer._optimizer_step_pre_hooks) + (wrapped is not None)
