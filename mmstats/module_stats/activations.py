# Copyright (c) mmstats contributors. All rights reserved.
"""Activation probes (:class:`ActivationProbes`): forward hooks registered
once, before ``torch.compile`` traces the model, and switched at run time.

torch.compile ignores module hooks added after the first compilation
(``skip_nnmodule_hook_guards``), so the hooks cannot come and go with the
instrumented iterations. They are registered once and stay:

- eagerly, a hook reads :attr:`ActivationProbes.armed` (a Python bool) and
  returns at once when it is off;
- while dynamo traces, a hook puts one side-effectful custom op per output
  tensor into the graph, ``mmstats::module_act(Tensor value, int probes,
  str name) -> ()``; its kernel (eager Python, run where the graph runs)
  reads the flag. Dynamo guards on nothing of mmstats: arming never
  recompiles.

The recomputation of ``torch.utils.checkpoint`` (both variants) runs the
forward again inside the backward pass: those outputs are not recorded
(:func:`in_backward`), so every output element counts once.
See ``docs/module_stats.md``.
"""
import itertools
import time
import weakref
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.fx.node import has_side_effect

from mmstats.health import NonfiniteWatch
from mmstats.stats import report
from mmstats.utils.torch_compat import is_compiling, register_fake

__all__ = ['ActivationProbes', 'in_backward', 'floating_tensors']

_LIB = torch.library.Library('mmstats', 'FRAGMENT')
_LIB.define('module_act(Tensor value, int probes, str name) -> ()')
_PROBES: 'weakref.WeakValueDictionary[int, ActivationProbes]' = (
    weakref.WeakValueDictionary())
_IDS = itertools.count()


def _module_act_kernel(value: torch.Tensor, probes: int, name: str) -> None:
    owner = _PROBES.get(probes)
    if owner is not None:
        owner.record(name, value)


def _module_act_fake(value: torch.Tensor, probes: int, name: str) -> None:
    return None


_LIB.impl('module_act', _module_act_kernel, 'CompositeExplicitAutograd')
register_fake('mmstats::module_act', _module_act_fake, _LIB)
has_side_effect(torch.ops.mmstats.module_act.default)

# The autograd engine's current graph task (-1 outside a backward pass); the
# function torch.utils.checkpoint itself uses to find its recomputations.
_graph_task_id = getattr(torch._C, '_current_graph_task_id', None)


def in_backward() -> bool:
    """Whether the autograd engine is running a backward pass on this
    thread (where activation checkpointing recomputes forwards).

    Example:
        >>> in_backward()  # a forward, or no pass at all
        False
    """
    return _graph_task_id is not None and _graph_task_id() != -1


in_backward.available = _graph_task_id is not None


class ActivationProbes:
    """One forward hook per module, registered at construction and kept
    until :meth:`remove`; outputs are reported only while :attr:`armed`,
    and checked for NaN/inf by ``watch`` while :attr:`armed` or
    :attr:`watching`.

    Args:
        modules (dict[str, nn.Module]): The modules by name.
        prefix (str): Outputs of module ``name`` are reported as
            ``<prefix>/<name>/act``.
        watch (NonfiniteWatch, optional): Told of every output seen (module
            indices in the order of ``modules``). Defaults to None.
        report_acts (bool): Whether to report the outputs (or only watch
            them). Defaults to True.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from mmstats import Collector
        >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
        >>> collector = Collector('acts/.*')
        >>> probes = ActivationProbes({'0': net[0]}, 'acts')
        >>> probes.armed = True
        >>> _ = net(torch.ones(4, 3))  # 4 x 2 output values reported
        >>> probes.remove()
        >>> collector.update()
        >>> collector.num('acts/0/act')
        8.0
    """

    def __init__(self,
                 modules: Dict[str, nn.Module],
                 prefix: str,
                 watch: Optional[NonfiniteWatch] = None,
                 report_acts: bool = True) -> None:
        self.armed = False
        self.watching = False  # watch every iteration, not only armed ones
        self.watch = watch
        self.report_acts = report_acts
        self.cost = 0.0  # host seconds spent recording, reset by the owner
        self.seen: set = set()  # keys recorded while armed (owner clears)
        self._index = {
            f'{prefix}/{name}/act': i
            for i, name in enumerate(modules)
        }
        self.id = next(_IDS)
        _PROBES[self.id] = self
        self._handles: List[torch.utils.hooks.RemovableHandle] = [
            module.register_forward_hook(self._hook(f'{prefix}/{name}/act'))
            for name, module in modules.items()
        ]

    def _hook(self, key: str):
        probes = self.id

        def forward_hook(module, args, output) -> None:
            if is_compiling():
                for tensor in floating_tensors(output):
                    torch.ops.mmstats.module_act(tensor, probes, key)
            elif self.armed or self.watching:
                for tensor in floating_tensors(output):
                    self.record(key, tensor)

        return forward_hook

    def record(self, key: str, tensor: torch.Tensor) -> None:
        """Report ``tensor`` under ``key`` if armed (and watch it if armed
        or watching), unless it is a checkpoint's recomputation."""
        if not (self.armed or self.watching) or in_backward():
            return
        start = time.perf_counter()
        if self.watch is not None:
            self.watch.forward(self._index[key], tensor.detach())
        if self.armed and self.report_acts:
            report(key, tensor.detach())
            self.seen.add(key)
        self.cost += time.perf_counter() - start

    def remove(self) -> None:
        """Remove the forward hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.armed = self.watching = False
        _PROBES.pop(self.id, None)


def floating_tensors(output: Any) -> List[torch.Tensor]:
    """The floating-point tensors of a module's output (tensor, tuple, list
    or dict, nested).

    Example:
        >>> import torch
        >>> out = {'logits': torch.ones(2), 'ids': torch.arange(2),
        ...        'aux': [torch.zeros(3)]}
        >>> [t.shape[0] for t in floating_tensors(out)]
        [2, 3]
    """
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in floating_tensors(item)]
    return []
