# Copyright (c) mmstats contributors. All rights reserved.
"""``report()`` inside ``torch.compile``: a side-effectful custom op.

While dynamo traces, :func:`~mmstats.stats.report` calls
:func:`report_traced` instead of touching the store: a tensor value becomes
``mmstats::report(Tensor value, str name, bool rank0) -> ()``. The op is
registered as effectful (``EffectType.ORDERED``, like
``aten::_print``), so AOTAutograd threads an effect token through them and
no pass removes or reorders them; its eager kernel calls ``report()`` at
run time. Dynamo therefore guards on nothing of the store, the collectors,
the phase or the suspension: they are read when the op runs, not when the
graph is traced. Other values (Python numbers, sequences, arrays)
graph-break into an eager ``report()`` (``torch.compiler.disable``): dynamo
specialises a Python float it computes with, so a changing float (a
learning rate) would recompile; a graph break passes it without a guard. See ``docs/reporting.md``.
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


_report_tensor.register_effect(EffectType.ORDERED)


@torch.compiler.disable
def _report_eager(name: str, value: Any, rank0: bool) -> None:
    (reporting.report0 if rank0 else reporting.report)(name, value)


def report_traced(name: str, value: Any, rank0: bool) -> Any:
    """What :func:`~mmstats.stats.report` does while dynamo traces it."""
    if isinstance(value, torch.Tensor):
        torch.ops.mmstats.report(value, name, rank0)
    else:
        _report_eager(name, value, rank0)
    return value


def _skip_top_level_frames() -> None:
    """After a graph break inside ``report()`` (a non-tensor value), dynamo
    would compile ``report`` as a frame of its own and guard on the value
    (a changing float would recompile): run those frames eagerly. Inlining
    ``report()`` into a traced caller is not affected."""
    from torch._dynamo.eval_frame import skip_code
    for fn in (reporting.report, reporting.report0, report_traced):
        skip_code(fn.__code__)


_skip_top_level_frames()
