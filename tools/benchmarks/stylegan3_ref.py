"""StyleGAN3's ``training_stats.report`` and an ATen operation counter, for
the benchmarks and the op-count tests.

``stylegan3_report`` is NVIDIA's code (NVlabs/stylegan3,
``torch_utils/training_stats.py``, Nvidia Source Code License), copied as
published apart from module globals renamed, to compare with in the same
run.
"""
from typing import Any, Callable, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ['stylegan3_report', 'stylegan3_reset', 'count_aten_ops']

_SG3_COUNTERS: dict = dict()
_SG3_DTYPE = torch.float64
_SG3_NUM_MOMENTS = 3
_SG3_COUNTER_DTYPE = torch.float64


def stylegan3_report(name, value):
    if name not in _SG3_COUNTERS:
        _SG3_COUNTERS[name] = dict()

    elems = torch.as_tensor(value)
    if elems.numel() == 0:
        return value

    elems = elems.detach().flatten().to(_SG3_DTYPE)
    moments = torch.stack([
        torch.ones_like(elems).sum(),
        elems.sum(),
        elems.square().sum(),
    ])
    assert moments.ndim == 1 and moments.shape[0] == _SG3_NUM_MOMENTS
    moments = moments.to(_SG3_COUNTER_DTYPE)

    device = moments.device
    if device not in _SG3_COUNTERS[name]:
        _SG3_COUNTERS[name][device] = torch.zeros_like(moments)
    _SG3_COUNTERS[name][device].add_(moments)
    return value


def stylegan3_reset() -> None:
    """Forget StyleGAN3's accumulated counters."""
    _SG3_COUNTERS.clear()


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
