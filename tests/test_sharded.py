"""Sharded training: StatsCollectorHook + ModuleStatsHook + PreciseBNHook
through real ``FlexibleRunner``s on 2 gloo processes.

Cells: ``DDPStrategy``; ``FSDPStrategy`` (FSDP1) with mmengine's default
wrapping (``use_orig_params=True``), with ``use_orig_params=False``, with
``NO_SHARD`` (one flat parameter replicated on both ranks: counted on rank
0 only) and with activation checkpointing; FSDP2 ``fully_shard`` per block
and at the root (``mmstats.FullyShard``), once with a
``MixedPrecisionPolicy(param_dtype=torch.bfloat16)`` and once with
``compile=True``, and as HSDP (``replicas=2``: a 2-D mesh whose
``Replicate`` dimension is counted on its first coordinate only);
``DeepSpeedStrategy`` with ZeRO 1, 2 and 3 (skipped
where DeepSpeed is not installed). The model (a Conv-BN stem, a Conv-BN
layer and a linear head with a one-element temperature) gives every
sharded case a
module wholly on one rank's shard, a parameter that straddles the shard
boundary and a rank whose shard of some module is empty: FSDP1's one flat
parameter puts the stem on rank 0, the head on rank 1 and cuts
``backbone.layer1.0.weight`` in two; FSDP2 shards every parameter on dim 0
(each straddles), and ``head.scale``'s one-element temperature lies wholly
on one rank under FSDP2 and ZeRO-3 (rank 0) and FSDP1 and ZeRO-1/2 (rank
1), empty on the other. In the cells of ``REPLICATED_PRIOR`` the head has a
frozen ``head.prior`` that no shard holds (ZeRO-1/2 partition trainable
parameters only; FSDP1 ignores it): replicated, counted on rank 0 only.

Every published number is checked against a float64 recomputation from the
*full* tensors, gathered by FSDP itself (``summon_full_params``,
``DTensor.full_tensor``) in a recorder hook, and from both ranks' raw
values, for exactly the iterations it covers (publications after
iterations 2 and 4; the optimizer steps every iteration).
"""
import functools
import importlib.util
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.registry import MODELS
from torch import nn
from torch.utils.checkpoint import checkpoint

from mmstats.utils.torch_compat import (dtensor_class, fsdp_module_class,
                                        register_step_hooks)
from tests.helpers.dist import run_distributed
from tests.helpers.flexible import flexible_cfg, use_strategy
from tests.helpers.runner import read_scalars
from tests.helpers.toy import ToyBNModel, ToyDataset

MAX_ITERS = 4
INTERVAL = 2
PUBLISHED = (2, 4)
SAMPLES = 64
TARGETS = ('backbone.stem', 'backbone.layer1', 'backbone.layer1.0', 'head',
           'head.scale')
MODULES = r'backbone\.(stem|layer1(\.0)?)|head(\.scale)?'
BN_NAMES = r'backbone\.(stem\.bn|layer1\.1)'  # fp32 under bf16 (CPU BN)


class Temperature(nn.Module):
    """Divides by a learned one-element temperature: a module wholly on one
    rank's shard, empty on the other, under every sharding."""

    def __init__(self) -> None:
        super().__init__()
        self.temperature = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.temperature


class Prior(nn.Module):
    """Adds a frozen prior to the logits: a parameter without a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = nn.Parameter(
            torch.linspace(-1., 1., 10), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.logits


class ScaledHead(nn.Module):
    """A linear head whose logits are divided by a learned temperature
    (and, with ``prior``, shifted by a frozen :class:`Prior`)."""

    def __init__(self, channels: int, prior: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(channels, 10)
        self.scale = Temperature()
        self.prior = Prior() if prior else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.scale(self.fc(x))
        return x if self.prior is None else self.prior(x)


@MODELS.register_module(force=True)
class ShardToyModel(ToyBNModel):
    """The toy BN model with a :class:`ScaledHead`; ``with_cp`` recomputes
    the backbone in backward; ``prior`` gives the head a frozen
    ``head.prior``."""

    def __init__(self,
                 with_cp: bool = False,
                 prior: bool = False,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.head = ScaledHead(8, prior)
        self.with_cp = with_cp

    def forward(self, inputs, data_samples=None, mode='tensor'):
        if self.with_cp and self.training and torch.is_grad_enabled():
            feats = checkpoint(self.backbone, inputs, use_reentrant=False)
        else:
            feats = self.backbone(inputs)
        logits = self.head(feats.mean(dim=(2, 3)))
        if mode == 'tensor':
            return logits
        return dict(
            loss=F.cross_entropy(logits.float(), data_samples['gt_label']))


def _full(tensor: torch.Tensor) -> torch.Tensor:
    DTensor = dtensor_class()
    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().double().flatten().clone()


@ROOT_HOOKS.register_module(force=True)
class FullTensorRecorder(Hook):
    """Per iteration: the loss, the targets' outputs, and around every
    optimizer step the full gradients (before the step) and the full
    weights before and after it, gathered by FSDP."""
    priority = 'HIGHEST'

    def __init__(self) -> None:
        self.losses, self.steps, self.acts = {}, {}, {}
        self.recording = False

    def before_train(self, runner) -> None:
        from mmstats.sharding import forward_modules
        _, inner = forward_modules(runner.model)
        self.root = runner.model if isinstance(runner.model,
                                               nn.Module) else inner
        modules = dict(inner.named_modules())
        self.targets = {name: modules[name] for name in TARGETS}
        for name, module in self.targets.items():
            module.register_forward_hook(
                functools.partial(self._act, runner, name))
        wrapper = runner.optim_wrapper
        self.zero = getattr(wrapper, '_model', None) is not None
        if self.zero:  # DeepSpeed: no torch step hooks
            step = wrapper.step

            def wrapped(**kwargs):
                self._pre(runner)
                step(**kwargs)
                self._post(runner)

            wrapper.step = wrapped
            return
        optimizer = wrapper.optimizer
        register_step_hooks(optimizer, lambda *_: self._pre(runner),
                            lambda *_: self._post(runner))

    @torch.compiler.disable
    def _act(self, runner, name, module, args, output) -> None:
        if self.recording and torch.is_grad_enabled():
            self.acts.setdefault(runner.iter, {})[name] = _full(output)

    def _gathered(self, grads: bool = True):
        """``{name: (weights, grads, trainable)}`` of the full tensors
        (float64; ``trainable``: per weight, whether it has a gradient)."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if self.zero:
            return self._read_zero(grads)
        if not isinstance(self.root, FSDP):
            return self._read()
        flat = self.root._handle.flat_param
        if flat._params is not None:  # use_orig_params=True
            with FSDP.summon_full_params(
                    self.root, writeback=False, with_grads=True):
                return self._read()
        # use_orig_params=False: gather the flat gradient, cut it by
        # FSDP's flat layout (parameters in order, then padding)
        shard = self.root._handle.sharded_grad
        pieces = [torch.empty_like(shard) for _ in range(2)]
        torch.distributed.all_gather(pieces, shard.contiguous())
        full = torch.cat(pieces)[:sum(flat._numels)].split(flat._numels)
        grads = {
            (id(info.module), info.param_name): grad
            for info, grad in zip(flat._param_infos, full)
        }
        with FSDP.summon_full_params(self.root, writeback=False):
            return self._read(grads)

    def _read_zero(self, with_grads: bool):
        """DeepSpeed: full gradients and values by ``safe_get_full_grad`` /
        ``safe_get_full_fp32_param`` (collectives: every rank calls them in
        the same order; fp32 training, so the master weights are the
        model's)."""
        from deepspeed.utils import (safe_get_full_fp32_param,
                                     safe_get_full_grad)
        params = list(self.root.parameters())
        # a frozen parameter has no fp32 copy: whole on every rank (ZeRO-1/2)
        values = {
            id(p): safe_get_full_fp32_param(p) if p.requires_grad else p
            for p in params
        }
        grads = {
            id(p):
            safe_get_full_grad(p) if with_grads and p.requires_grad else None
            for p in params
        }
        out = {}
        for name, module in list(self.targets.items()) + [('', None)]:
            mine = list((module or self.root).parameters())
            out[name] = ([_full(values[id(p)]) for p in mine], [
                _full(grads[id(p)]) for p in mine if grads[id(p)] is not None
            ], [p.requires_grad for p in mine])
        return out

    def _read(self, flat_grads=None):
        out = {}
        for name, module in list(self.targets.items()) + [('', None)]:
            grads, weights, trainable = [], [], []
            for owner in (module or self.root).modules():
                for pname, p in owner.named_parameters(recurse=False):
                    weights.append(_full(p))
                    trainable.append(p.requires_grad)
                    if flat_grads is None or not p.requires_grad:
                        if p.grad is not None:
                            grads.append(_full(p.grad))
                        continue
                    grads.append(_full(flat_grads[id(owner), pname]))
            out[name] = (weights, grads, trainable)
        return out

    def _pre(self, runner) -> None:
        self.steps[runner.iter] = dict(before=self._gathered())

    def _post(self, runner) -> None:
        self.steps[runner.iter]['after'] = self._gathered(grads=False)
        if self.zero:
            self._poison_padding()

    def _poison_padding(self) -> None:
        """ZeRO-3 pads each partition to the same size: fill the padding
        with NaN (no forward reads it), so a statistic that counted it
        would be NaN, whatever the padding happened to hold."""
        import torch.distributed as dist
        for p in self.root.parameters():
            if not hasattr(p, 'ds_tensor'):
                continue
            flat = p.ds_tensor.data.view(-1)
            start = flat.numel() * dist.get_rank(p.ds_process_group)
            flat[max(0, min(flat.numel(), p.ds_numel - start)):] = math.nan

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.recording = True

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        self.recording = False
        self.losses[runner.iter] = float(outputs['loss'].detach().double())


@ROOT_HOOKS.register_module(force=True)
class ShardStateRecorder(Hook):
    """After every hook's ``after_train_iter`` (precise BN's forwards
    included): whether every FSDP unit / FSDP2 parameter is sharded."""
    priority = 'LOWEST'

    def __init__(self) -> None:
        self.states = []

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        from mmstats.sharding import forward_modules
        model = runner.model
        if not isinstance(model, nn.Module):  # DeepSpeed
            model = forward_modules(model)[1]
        self.states.append(all(_sharded_state(model)))


def _norm(tensors) -> float:
    return float(torch.cat(tensors).norm()) if tensors else 0.0


def _summary(recorder: FullTensorRecorder) -> dict:
    """Plain numbers per step: norms of the full tensors."""
    steps = {}
    for it, step in recorder.steps.items():
        before, after = step['before'], step['after']
        steps[it] = {}
        for name in list(TARGETS) + ['']:
            w0, grads, trainable = before[name]
            w1 = after[name][0]
            # over the parameters with a gradient (docs/module_stats.md)
            w0, w1 = ([w for w, t in zip(ws, trainable) if t]
                      for ws in (w0, w1))
            steps[it][name] = dict(
                grad_norm=_norm(grads),
                weight_norm=_norm(after[name][0]),
                update_ratio=_norm([a - b
                                    for a, b in zip(w1, w0)]) / _norm(w0))
    return steps


def _sharded_state(model) -> list:
    """Per FSDP unit / DTensor parameter: whether it is sharded now."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    DTensor = dtensor_class()
    states = []
    for module in model.modules():
        if isinstance(module, FSDP) and module._handle is not None:
            flat = module._handle.flat_param
            states.append(flat.data_ptr() == flat._local_shard.data_ptr()
                          and (flat.numel() < sum(flat._numels)
                               or not module._handle.uses_sharded_strategy))
    FSDPModule = fsdp_module_class() or ()  # none before torch 2.4
    if isinstance(model, FSDPModule):  # unsharded: plain tensors
        states += [isinstance(p, DTensor) for p in model.parameters()]
    # DeepSpeed ZeRO-3: a released parameter holds no data
    states += [
        p.data.numel() == 0 for p in model.parameters()
        if hasattr(p, 'ds_tensor')
    ]
    return states


#: the cells whose model has a frozen ``head.prior`` replicated on every
#: rank outside the shards: ZeRO-1/2 partition the trainable parameters
#: only; FSDP1's flat parameter ignores it (``ignored_modules``: a flat
#: parameter cannot mix frozen and trainable parameters)
REPLICATED_PRIOR = ('fsdp_flat', 'zero1', 'zero2')


def shard_toy_cfg(work_dir, rank, **model):
    """The FlexibleRunner config of ``ShardToyModel(**model)`` on rank
    ``rank``: SAMPLES samples in batches of 8, MAX_ITERS iterations,
    published every INTERVAL; no strategy yet."""
    cfg = flexible_cfg(
        work_dir,
        rank,
        num_samples=SAMPLES,
        batch_size=8,
        max_iters=MAX_ITERS,
        log_interval=INTERVAL)
    cfg.model = dict(type='ShardToyModel', **model)
    cfg.train_dataloader.dataset = dict(type='ToyDataset', num_samples=SAMPLES)
    return cfg


def _train(rank, world, work_dir, strategy, compiled=False, with_cp=False):
    from mmengine.runner import FlexibleRunner

    from mmstats.module_stats import norms
    torch.manual_seed(rank)
    prior = strategy in REPLICATED_PRIOR
    cfg = shard_toy_cfg(work_dir, rank, with_cp=with_cp, prior=prior)
    use_strategy(
        cfg, 'fsdp2' if strategy == 'fsdp2_bf16' else strategy,
        **(dict(param_dtype='bfloat16', fp32_modules=BN_NAMES)
           if strategy == 'fsdp2_bf16' else {}))
    if prior and strategy.startswith('fsdp'):
        cfg.strategy.model_wrapper.ignored_modules = ['head.prior']
    if compiled:
        cfg.compile = True
    cfg.custom_hooks = [
        dict(
            type='mmstats.PreciseBNHook',
            num_samples=SAMPLES,
            interval=MAX_ITERS,
            progress=False),
        dict(
            type='mmstats.StatsCollectorHook',
            stats=('num', 'mean', 'min', 'max'),
            collect=('outputs', )),
        dict(type='mmstats.ModuleStatsHook', modules=MODULES),
        dict(type='FullTensorRecorder'),
        dict(type='ShardStateRecorder'),
    ]
    reductions, collected = [], []
    original, collect = norms.all_reduce, norms.ModuleNorms.collect

    def counted(*args, **kwargs):
        reductions.append(1)
        return original(*args, **kwargs)

    def names_of(self, probes):  # the names this rank reports
        found = collect(self, probes)
        collected.append(sorted(name for name, _ in found))
        return found

    norms.all_reduce, norms.ModuleNorms.collect = counted, names_of
    try:
        runner = FlexibleRunner.from_cfg(cfg)
        runner.train()
    finally:
        norms.all_reduce, norms.ModuleNorms.collect = original, collect
    recorder = [h for h in runner.hooks
                if isinstance(h, FullTensorRecorder)][0]
    bn = recorder.targets['backbone.stem'].bn
    return dict(
        published=read_scalars(runner, missing_ok=True),
        losses=recorder.losses,
        acts={
            it: {
                n: v.numpy()
                for n, v in acts.items()
            }
            for it, acts in recorder.acts.items()
        },
        steps=_summary(recorder),
        stem_weight=recorder.steps[MAX_ITERS -
                                   1]['after']['backbone.stem'][0][0].numpy(),
        bn=(bn.running_mean.double().numpy(), bn.running_var.double().numpy()),
        sharded=[h for h in runner.hooks
                 if isinstance(h, ShardStateRecorder)][0].states,
        reductions=len(reductions),
        collected=collected)


def _check(ranks, strategy):
    first = ranks[0]['published']
    start = 0
    for end in PUBLISHED:
        scalars = first[end]
        losses = [r['losses'][it] for r in ranks for it in range(start, end)]
        assert scalars['stats/loss/num'] == len(losses)
        assert scalars['stats/loss/mean'] == pytest.approx(
            np.mean(losses), rel=1e-9)
        assert scalars['stats/loss/max'] == pytest.approx(max(losses))
        for name in TARGETS:
            acts = np.concatenate([r['acts'][end - 1][name] for r in ranks])
            key = f'stats/modules/{name}'
            assert scalars[f'{key}/act/num'] == acts.size
            assert scalars[f'{key}/act/mean'] == pytest.approx(
                acts.mean(), rel=1e-5, abs=1e-7)
            # the full tensors' norms at the publication's step; every rank
            # holds the same value
            for stat in ('grad_norm', 'weight_norm', 'update_ratio'):
                ref = ranks[0]['steps'][end - 1][name][stat]
                for r in ranks[1:]:
                    assert r['steps'][end - 1][name][stat] == pytest.approx(
                        ref, rel=1e-9)
                # one value per publication on every rank: published as
                # its value alone (a spread of it could not vary)
                for spread in ('num', 'std', 'min', 'max'):
                    assert f'{key}/{stat}/{spread}' not in scalars, stat
                assert scalars[f'{key}/{stat}/mean'] == pytest.approx(
                    ref, rel=1e-6), (name, stat)
        total = ranks[0]['steps'][end - 1]['']['grad_norm']
        assert scalars['stats/modules/total_grad_norm/mean'] == pytest.approx(
            total, rel=1e-6)
        start = end
    # precise BN: the stem's BN over every sample with the final weights,
    # identical on both ranks
    images = ToyDataset(num_samples=SAMPLES).images.double()
    weight = torch.from_numpy(ranks[0]['stem_weight']).view(8, 1, 3, 3)
    out = F.conv2d(images, weight, padding=1)
    mean = out.mean(dim=(0, 2, 3)).numpy()
    var = out.var(dim=(0, 2, 3), unbiased=False).numpy()
    rtol = 2e-2 if strategy == 'fsdp2_bf16' else 1e-6
    for r in ranks:
        np.testing.assert_array_equal(r['bn'][0], ranks[0]['bn'][0])
        np.testing.assert_array_equal(r['bn'][1], ranks[0]['bn'][1])
        np.testing.assert_allclose(r['bn'][0], mean, rtol=rtol, atol=1e-6)
        np.testing.assert_allclose(r['bn'][1], var, rtol=rtol, atol=1e-6)
    # every rank reports every statistic, also of a module none of whose
    # elements it holds (an empty part is a gradient of zero elements, not
    # "no gradient"): the ranks agree on the names without a gather
    assert len(first_names := ranks[0]['collected']) == len(PUBLISHED)
    for names in first_names:
        for name in TARGETS:
            for stat in ('grad_norm', 'weight_norm', 'update_ratio'):
                assert f'modules/{name}/{stat}' in names, (name, stat)
    for r in ranks[1:]:
        assert r['collected'] == first_names
    for r in ranks:
        # as sharded as training left it; one all_reduce per publication
        # (none without sharding)
        assert all(r['sharded']), r['sharded']
        assert r['reductions'] == (0 if strategy == 'ddp' else len(PUBLISHED))


CELLS = [
    ('ddp', False, False),
    ('fsdp', False, False),
    ('fsdp_flat', False, False),
    ('fsdp_noshard', False, False),
    ('fsdp', False, True),
    ('fsdp2', False, False),
    ('fsdp2_bf16', False, False),
    ('fsdp2', True, False),
    ('fsdp2_hsdp', False, False),
    ('zero1', False, False),
    ('zero2', False, False),
    ('zero3', False, False),
]


@pytest.mark.parametrize(
    'strategy,compiled,with_cp',
    CELLS,
    ids=[
        f'{s}{"-compile" if c else ""}{"-checkpointing" if w else ""}'
        for s, c, w in CELLS
    ])
def test_flexible_runner(tmp_path, strategy, compiled, with_cp):
    if strategy.startswith(
            'zero') and not importlib.util.find_spec('deepspeed'):
        pytest.skip('DeepSpeed is not installed (requirements/tests.txt)')
    ranks = run_distributed(
        _train, 2, str(tmp_path), strategy, compiled, with_cp, timeout=600)
    _check(ranks, strategy)


class ColossalAIStrategy:
    """Stands in for mmengine's ColossalAIStrategy (ColossalAI cannot be
    installed here): the hooks look at the strategy's class name."""


@pytest.mark.parametrize(
    'hook', ['StatsCollectorHook', 'ModuleStatsHook', 'PreciseBNHook'])
def test_an_unchecked_strategy_is_refused_at_before_run(hook):
    from types import SimpleNamespace

    from mmstats.registry import HOOKS
    args = dict(modules='x') if hook == 'ModuleStatsHook' else {}
    built = HOOKS.build(dict(type=f'mmstats.{hook}', **args))
    with pytest.raises(
            RuntimeError, match=f'{hook}: ColossalAIStrategy is '
            'not supported'):
        built.before_run(SimpleNamespace(strategy=ColossalAIStrategy()))


@pytest.mark.parametrize('name', ['fsdp', 'fsdp2', 'deepspeed_zero3'])
def test_strategy_fragments_load(name):
    import os.path as osp

    from mmengine.config import Config
    from mmengine.model import is_model_wrapper
    from mmengine.registry import MODEL_WRAPPERS

    from mmstats.wrappers import FullyShard
    root = osp.dirname(osp.dirname(osp.abspath(__file__)))
    cfg = Config.fromfile(
        osp.join(root, 'configs', '_base_', 'strategies', f'{name}.py'))
    assert cfg.runner_type == 'FlexibleRunner'
    wrapper = cfg.strategy.get('model_wrapper', {}).get('type')
    if wrapper == 'mmstats.FullyShard':
        assert MODEL_WRAPPERS.get(wrapper) is FullyShard
        # a class whose construction returns the module: no model is one
        assert not is_model_wrapper(nn.Linear(2, 2))
