"""A hook that writes down, per rank, the raw values mmstats' hooks publish.

The downstream checks (``tools/downstream/checks``) import it through the
configs' ``custom_imports`` (``PYTHONPATH=tools/downstream``) and recompute
every published number in float64 from what it wrote:

- per training iteration: ``train_step``'s outputs (the loss terms), the
  batch's number of images; for each module matching ``modules``: its
  outputs (per tensor: count, sum, sum of squared deviations, min, max),
  the L2 norm of its parameters after the step, and, at the optimizer step,
  the norm of its gradients and ``||w_after - w_before|| / ||w_before||``
  over the parameters that have one; the norm of all gradients;
- per precise-BN recomputation (a BN layer in training mode called with
  gradients off): each batch's number of samples and per-channel count,
  sum and sum of squared deviations of every BN layer's input; every BN
  layer's buffers right before and right after it;
- every BN layer's buffers and mode, and the frozen parameters, before and
  after training.

It writes ``<work_dir>/recorder/rank<R>.pkl`` in ``after_train``.

Example:
    .. code-block:: python

        custom_imports = dict(imports=['mmstats.launch.cpu_dist',
                                       'downstream_recorder'])
        custom_hooks = [..., dict(type='DownstreamRecorderHook',
                                  modules=r'backbone\\.layer\\d')]
"""
import os
import os.path as osp
import pickle
import re
from typing import Any, Dict, List, Optional

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ['DownstreamRecorderHook']


def _bare(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, 'module', model)


def _tensors(output: Any) -> List[torch.Tensor]:
    # written apart from mmstats.module_stats.activations.floating_tensors
    # on purpose: the recomputation must not share the code it checks
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors(item)]
    return []


def _moments(x: torch.Tensor) -> tuple:
    """float64 (count, sum, sum of squared deviations, min, max)."""
    x = x.detach().double().flatten()
    mean = x.mean()
    return (x.numel(), float(x.sum()), float(
        ((x - mean)**2).sum()), float(x.min()), float(x.max()))


def _norm(tensors: List[torch.Tensor]) -> float:
    if not tensors:
        return float('nan')
    return float(
        torch.cat([t.detach().double().flatten() for t in tensors]).norm())


@HOOKS.register_module()
class DownstreamRecorderHook(Hook):
    """Record, per rank, what the checks recompute mmstats' numbers from.

    Args:
        modules (str): ``re.fullmatch`` on module names: the modules whose
            outputs and norms are recorded (ModuleStatsHook's ``modules``).
    """
    # first at every hook point: before PreciseBNHook's recomputation in
    # after_train_iter / after_train_epoch
    priority = 'HIGHEST'

    def __init__(self, modules: str) -> None:
        self.pattern = re.compile(modules)
        self.iters: List[dict] = []
        self.bn_runs: List[Dict[str, list]] = []
        self.before: Dict[str, Any] = {}
        self._current: Optional[dict] = None
        self._new_run = True
        self._handles: list = []
        self._step_before: Optional[dict] = None
        self._bn_state: Optional[dict] = None

    # -- set-up ------------------------------------------------------------
    def before_train(self, runner) -> None:
        model = _bare(runner.model)
        self.targets = {
            name: module
            for name, module in model.named_modules()
            if name and self.pattern.fullmatch(name)
        }
        self.before = self._state(model)
        for name, module in self.targets.items():
            self._handles.append(
                module.register_forward_hook(self._act_hook(name)))
        for name, module in model.named_modules():
            if isinstance(module, _BatchNorm):
                self._handles.append(
                    module.register_forward_pre_hook(self._bn_hook(name)))
        optimizer = runner.optim_wrapper.optimizer
        self._handles.append(optimizer.register_step_pre_hook(self._pre_step))
        self._handles.append(
            optimizer.register_step_post_hook(self._post_step))
        self._optimizer = optimizer

    @staticmethod
    def _state(model: torch.nn.Module) -> dict:
        bns = {
            name:
            dict(
                training=m.training,
                buffers={
                    k: v.detach().clone().numpy()
                    for k, v in m.named_buffers()
                })
            for name, m in model.named_modules() if isinstance(m, _BatchNorm)
        }
        frozen = {
            name: p.detach().clone().numpy()
            for name, p in model.named_parameters() if not p.requires_grad
        }
        return dict(bn=bns, frozen=frozen)

    # -- hooks on the model and the optimizer ------------------------------
    def _act_hook(self, name: str):

        def hook(module, args, output) -> None:
            if self._current is not None:
                self._current['act'].setdefault(name, []).extend(
                    _moments(t) for t in _tensors(output))

        return hook

    def _bn_hook(self, name: str):

        def hook(module, args) -> None:
            if not module.training or torch.is_grad_enabled():
                return  # training forwards and evaluation
            if self._new_run:  # the first forward of a recomputation
                self.bn_runs.append(dict(before=self._bn_state, batches={}))
                self._new_run = False
            x = args[0].detach()
            samples = x.shape[0]
            x = x.double().transpose(0, 1).flatten(1)
            mean = x.mean(1, keepdim=True)
            self.bn_runs[-1]['batches'].setdefault(name, []).append(
                (samples, x.shape[1], x.sum(1).numpy(),
                 ((x - mean)**2).sum(1).numpy()))

        return hook

    def _params_with_grad(self, module: torch.nn.Module) -> list:
        return [p for p in module.parameters() if p.grad is not None]

    def _pre_step(self, optimizer, args, kwargs) -> None:
        if self._current is None:
            return
        grads = [
            p.grad for group in optimizer.param_groups for p in group['params']
            if p.grad is not None
        ]
        self._current['total_grad_norm'] = _norm(grads)
        self._step_before = {}
        for name, module in self.targets.items():
            params = self._params_with_grad(module)
            if params:
                self._current['grad_norm'][name] = _norm(
                    [p.grad for p in params])
                self._step_before[name] = (params, [
                    p.detach().clone() for p in params
                ])

    def _post_step(self, optimizer, args, kwargs) -> None:
        if self._current is None or self._step_before is None:
            return
        for name, (params, before) in self._step_before.items():
            after = [p.detach() for p in params]
            self._current['update_ratio'][name] = _norm(
                [a - b for a, b in zip(after, before)]) / _norm(before)
        self._step_before = None

    # -- per iteration -----------------------------------------------------
    def _bn_buffers(self, runner) -> dict:
        return {
            name: {
                k: v.detach().clone().numpy()
                for k, v in m.named_buffers()
            }
            for name, m in _bare(runner.model).named_modules()
            if isinstance(m, _BatchNorm)
        }

    def _close_run(self, runner) -> None:
        """The statistics a recomputation left (before training goes on)."""
        if self.bn_runs and 'after' not in self.bn_runs[-1]:
            self.bn_runs[-1]['after'] = self._bn_buffers(runner)

    def after_train_epoch(self, runner) -> None:
        self._bn_state = self._bn_buffers(runner)  # before a recomputation

    def before_train_iter(self, runner, batch_idx: int, data_batch=None):
        self._close_run(runner)
        self._new_run = True  # a recomputation after this is a new one
        self._current = dict(
            iter=runner.iter + 1,
            act={},
            grad_norm={},
            update_ratio={},
            bn_training=sorted(
                name for name, m in _bare(runner.model).named_modules()
                if isinstance(m, _BatchNorm) and m.training))

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        record, self._current = self._current, None
        record['losses'] = {
            k: float(torch.as_tensor(v).detach().double())
            for k, v in (outputs or {}).items()
        }
        inputs = data_batch['inputs']
        record['batch_size'] = len(inputs)
        self._bn_state = self._bn_buffers(runner)  # before a recomputation
        record['weight_norm'] = {
            name: _norm(list(module.parameters()))
            for name, module in self.targets.items()
        }
        self.iters.append(record)

    def after_train(self, runner) -> None:
        self._close_run(runner)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        model = _bare(runner.model)
        folder = osp.join(runner.work_dir, 'recorder')
        os.makedirs(folder, exist_ok=True)
        with open(osp.join(folder, f'rank{get_rank()}.pkl'), 'wb') as f:
            pickle.dump(
                dict(
                    iters=self.iters,
                    bn_runs=self.bn_runs,
                    before=self.before,
                    after=self._state(model),
                    modules=sorted(self.targets),
                    world_size=runner.world_size), f)
