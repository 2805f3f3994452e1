# Copyright (c) mmstats contributors. All rights reserved.
"""``report()`` inside ``torch.compile``: two side-effectful custom ops.

While dynamo traces, :func:`~mmstats.stats.report` calls
:func:`report_traced` instead of touching the store: a tensor value becomes
``mmstats::report(Tensor value, str name, bool rank0) -> ()``, a Python
number ``mmstats::report_number(float value, str name, bool rank0) -> ()``.
Both ops are registered as effectful (``EffectType.ORDERED``, like
``aten::_print``), so AOTAutograd threads an effect token through them and
no pass removes or reorders them; their eager kernels call ``report()`` at
run time. Dynamo therefore guards on nothing of the store, the collectors,
the phase or the suspension: they are read when the op runs, not when the
graph is traced. Other values (sequences, arrays) graph-break into an eager
``report()`` (``torch.compiler.disable``). See ``docs/reporting.md``.
"""
from typing import Any

import torch
from torch._library.effects import EffectType

from . import reporting

__all__ = ['report_traced']


@torch.library.custom_op('mmstats::report', mutates_args=())
def _report_tensor(value: torch.Tensor, name: str, rank0: bool) -> None:
    (reporting.report0 if rank0 else reporting.report)(name, value)


@_report_tensor.register_fake
def _report_tensor_fake(value: torch.Tensor, name: str, rank0: bool) -> None:
    return None


@torch.library.custom_op('mmstats::report_number', mutates_args=())
def _report_number(value: float, name: str, rank0: bool) -> None:
    (reporting.report0 if rank0 else reporting.report)(name, value)


@_report_number.register_fake
def _report_number_fake(value: float, name: str, rank0: bool) -> None:
    return None


_report_tensor.register_effect(EffectType.ORDERED)
_report_number.register_effect(EffectType.ORDERED)


@torch.compiler.disable
def _report_eager(name: str, value: Any, rank0: bool) -> None:
    (reporting.report0 if rank0 else reporting.report)(name, value)


def report_traced(name: str, value: Any, rank0: bool) -> Any:
    """What :func:`~mmstats.stats.report` does while dynamo traces it."""
    if isinstance(value, torch.Tensor):
        torch.ops.mmstats.report(value, name, rank0)
    elif isinstance(value, (float, int)) and not isinstance(value, bool):
        torch.ops.mmstats.report_number(float(value), name, rank0)
    else:
        _report_eager(name, value, rank0)
    return value
