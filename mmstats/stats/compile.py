# Copyright (c) mmstats contributors. All rights reserved.
"""``report()`` inside ``torch.compile``: a side-effectful custom op.

While dynamo traces, :func:`~mmstats.stats.report` calls
:func:`report_traced` instead of touching the store: a tensor value becomes
``mmstats::report(Tensor value, str name, bool rank0) -> ()``. The op (a
``torch.library`` definition with a Python kernel) is marked as having a
side effect (``torch.fx.node.has_side_effect``), so dead-code elimination
keeps it although it returns nothing; its kernel calls ``report()`` at
run time. Dynamo therefore guards on nothing of the store, the collectors,
the phase or the suspension: they are read when the op runs, not when the
graph is traced. Other values (Python numbers, sequences, arrays)
graph-break into an eager ``report()`` (``torch.compiler.disable``): dynamo
specialises a Python float it computes with, so a changing float (a
learning rate) would recompile; a graph break passes it without a guard.
See ``docs/reporting.md``.
"""
from typing import Any

import torch
from torch.fx.node import has_side_effect

from . import reporting

__all__ = ['report_traced']

_LIB = torch.library.Library('mmstats', 'DEF')
_LIB.define('report(Tensor value, str name, bool rank0) -> ()')


def _report_kernel(value: torch.Tensor, name: str, rank0: bool) -> None:
    (reporting.report0 if rank0 else reporting.report)(name, value)


def _report_fake(value: torch.Tensor, name: str, rank0: bool) -> None:
    return None


_LIB.impl('report', _report_kernel, 'CompositeExplicitAutograd')
torch.library.register_fake('mmstats::report', _report_fake, lib=_LIB)
# No output: without this mark, dead-code elimination drops the call.
has_side_effect(torch.ops.mmstats.report.default)


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
