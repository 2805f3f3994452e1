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
import sys
from typing import Any

import torch
from torch.fx.node import has_side_effect

from . import reporting

__all__ = ['report_traced', 'enable_compile_support']

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


def _report_eager_impl(name: str, value: Any, rank0: bool) -> None:
    (reporting.report0 if rank0 else reporting.report)(name, value)


# ``_report_eager_impl`` behind ``torch.compiler.disable`` once
# :func:`enable_compile_support` ran (the decorator imports dynamo).
_report_eager = _report_eager_impl
_SUPPORT_ENABLED = [False]


def enable_compile_support() -> bool:
    """Prepare dynamo for ``report()`` (idempotent; imports dynamo).

    Wraps the eager fallback in ``torch.compiler.disable`` and marks the
    top-level frames of ``report`` / ``report0`` / :func:`report_traced`
    as skipped: after a graph break inside ``report()`` (a non-tensor
    value), dynamo would compile ``report`` as a frame of its own and guard
    on the value (a changing float would recompile); skipped, those frames
    run eagerly. Inlining ``report()`` into a traced caller is not
    affected.

    Importing ``torch._dynamo`` changes process-wide state (it adds classes
    to ``torch.serialization``'s safe globals), so ``import mmstats`` does
    not call this: it runs at import only if dynamo is already imported,
    else on the first trace of :func:`report_traced` (dynamo calls it at
    trace time, see below), when dynamo is imported anyway.

    Returns:
        bool: True.
    """
    if _SUPPORT_ENABLED[0]:
        return True
    global _report_eager
    from torch._dynamo.eval_frame import skip_code
    _report_eager = torch.compiler.disable(_report_eager_impl)
    for fn in (reporting.report, reporting.report0, report_traced):
        skip_code(fn.__code__)
    _SUPPORT_ENABLED[0] = True
    return True


# What ``torch.compiler.assume_constant_result`` does, without importing
# dynamo: dynamo calls the function while tracing and keeps its result as a
# constant, so the first trace enables compile support before it reads
# ``_report_eager``. Checked by tests/test_stats/test_report_compile.py in
# a fresh interpreter.
enable_compile_support._dynamo_marked_constant = True  # type: ignore


def report_traced(name: str, value: Any, rank0: bool) -> Any:
    """What :func:`~mmstats.stats.report` does while dynamo traces it."""
    enable_compile_support()  # a trace-time constant
    if isinstance(value, torch.Tensor):
        torch.ops.mmstats.report(value, name, rank0)
    else:
        _report_eager(name, value, rank0)
    return value


if 'torch._dynamo' in sys.modules:
    enable_compile_support()
