"""StyleGAN3's ``training_stats.report`` and an ATen operation counter, for
the benchmarks and the op-count tests.

``stylegan3_report`` re-implements, operation for operation, ``report()``
of NVlabs/stylegan3 ``torch_utils/training_stats.py`` (2021): the values
flattened and cast to float32 (its ``_reduce_dtype``), the moments
``[count, sum, sum of squares]`` stacked, cast to float64 (its
``_counter_dtype``) and added to a per-name, per-device counter.
"""
from typing import Any, Callable, Dict, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ['stylegan3_report', 'stylegan3_reset', 'count_aten_ops']

_COUNTERS: Dict[str, Dict[Any, torch.Tensor]] = {}


def stylegan3_report(name: str, value: Any) -> Any:
    """StyleGAN3's ``report(name, value)``, the same ATen operations."""
    per_device = _COUNTERS.setdefault(name, {})
    values = torch.as_tensor(value)
    if values.numel() == 0:
        return value
    values = values.detach().flatten().to(torch.float32)
    moments = torch.stack(
        [torch.ones_like(values).sum(),
         values.sum(),
         values.square().sum()]).to(torch.float64)
    if moments.device not in per_device:
        per_device[moments.device] = torch.zeros_like(moments)
    per_device[moments.device].add_(moments)
    return value


def stylegan3_reset() -> None:
    """Forget the accumulated counters."""
    _COUNTERS.clear()


class _CountOps(TorchDispatchMode):

    def __init__(self) -> None:
        super().__init__()
        self.ops: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def count_aten_ops(fn: Callable[[], Any]) -> List[str]:
    """The ATen operations ``fn()`` issues (after autograd, as the
    dispatcher sees them: the same on every device)."""
    with _CountOps() as mode:
        fn()
    return mode.ops
