# Copyright (c) mmstats contributors. All rights reserved.
"""ModuleStatsHook's optimizer side: gradient norms and update ratios from
torch's optimizer step hooks, one pair per optimizer.

``Optimizer.register_step_pre_hook`` runs right before the parameters are
updated: after DDP's reduction and, under a ``GradScaler``, after
``unscale_`` (``GradScaler.step`` unscales, then calls ``optimizer.step``
only if every gradient is finite). A step the scaler skips calls neither
hook, so its gradients never reach the statistics; it is counted instead.
The hooks are registered once in ``before_train`` and run eagerly even
inside a compiled ``train_step`` (``torch.compiler.disable``: dynamo breaks
the graph there and guards on nothing of them).
"""
import time
from typing import List, Optional, Sequence, Tuple

import torch
from mmengine.optim import OptimWrapper
from torch import nn

from mmstats.stats import report
from .module_tensors import SegmentNorms

__all__ = ['StepProbe']

Owned = List[Tuple[int, nn.Parameter]]


class StepProbe:
    """Gradient and update statistics of the modules whose parameters one
    optimizer owns.

    Args:
        optim_wrapper (OptimWrapper): The wrapper of the optimizer.
        owned (list[tuple[int, nn.Parameter]]): ``(module index,
            parameter)`` of every matched module, recursively.
        keys (Sequence[str]): ``<prefix>/<name>`` of module ``i``.
        stats (Sequence[str]): Which of ``grad_norm`` and ``update_ratio``
            to report.
    """

    def __init__(self, optim_wrapper: OptimWrapper, owned: Owned,
                 keys: Sequence[str], stats: Sequence[str]) -> None:
        self.optim_wrapper = optim_wrapper
        optimizer = optim_wrapper.optimizer
        mine = {
            id(p)
            for group in optimizer.param_groups
            for p in group['params']
        }
        self.params: Owned = [(i, p) for i, p in owned if id(p) in mine]
        self.keys = list(keys)
        self.stats = [s for s in stats if s in ('grad_norm', 'update_ratio')]
        scaler = getattr(optim_wrapper, 'loss_scaler', None)
        self.amp = scaler is not None and scaler.is_enabled()
        self.armed = False
        self.calls = 0  # optimizer steps in this iteration
        self.cost = 0.0
        self._count_before = 0
        self._before: Optional[tuple] = None
        # segments [0, M): gradients or updates, [M, 2M): weights before
        self._norms = SegmentNorms(2 * len(self.keys))
        self._handles = [
            optimizer.register_step_pre_hook(
                torch.compiler.disable(self._pre_step)),
            optimizer.register_step_post_hook(
                torch.compiler.disable(self._post_step)),
        ]

    # -- per iteration (called by the hook, outside compiled code) --------
    def begin_iteration(self, armed: bool) -> None:
        """Arm (or not) the statistics of this iteration's steps."""
        self.armed = armed and bool(self.stats) and bool(self.params)
        self.calls = 0
        self._count_before = self.optim_wrapper._inner_count

    def end_iteration(self) -> int:
        """Disarm; return how many due steps the GradScaler skipped in this
        iteration (0 without AMP)."""
        self.armed = False
        self._before = None
        if not self.amp:
            return 0
        wrapper = self.optim_wrapper
        due = int(wrapper._inner_count != self._count_before
                  and wrapper.should_update())
        return max(due - self.calls, 0)

    def remove(self) -> None:
        """Remove the step hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- the step hooks ----------------------------------------------------
    def _pre_step(self, optimizer, args, kwargs) -> None:
        self.calls += 1
        if not self.armed:
            return
        start = time.perf_counter()
        grads, params, owners = [], [], []
        for index, param in self.params:
            if param.grad is not None:
                grads.append(param.grad)
                params.append(param.detach())
                owners.append(index)
        if params:
            if 'grad_norm' in self.stats:
                norms = self._norms(grads, owners)
                self._report('grad_norm', norms, owners)
            if 'update_ratio' in self.stats:  # copies of the weights
                self._before = (params, torch._foreach_mul(params,
                                                           1.0), owners)
        self.cost += time.perf_counter() - start

    def _post_step(self, optimizer, args, kwargs) -> None:
        if self._before is None:
            return
        start = time.perf_counter()
        params, old, owners = self._before
        self._before = None
        num = len(self.keys)
        norms = self._norms(
            torch._foreach_sub(params, old) + old,
            owners + [num + o for o in owners]).view(2, -1)
        self._report('update_ratio', norms[0] / norms[1], owners)
        self.cost += time.perf_counter() - start

    def _report(self, stat: str, values: torch.Tensor,
                owners: List[int]) -> None:
        for index in sorted(set(owners)):
            report(f'{self.keys[index]}/{stat}', values[index])
