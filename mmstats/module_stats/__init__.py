# Copyright (c) mmstats contributors. All rights reserved.
"""Module statistics: what ``ModuleStatsHook`` publishes, without a Runner
(``docs/module_stats.md``).

Modules: :mod:`.activations` (forward probes armed at run time through the
``mmstats::module_act`` op, so compiled graphs never change),
:mod:`.steps` (optimizer step probes: gradients before clipping, updates,
DeepSpeed's ``step`` wrapped), :mod:`.optimizer_state` (the sums behind
the optimizer-state norms and cosines, products in float64),
:mod:`.norms` (one payload, one ``all_reduce`` on sharded models,
unpacked into named norms and cosines), :mod:`.summary` (the log line's
summary, the names that hold one value per publication).
"""
from .activations import ActivationProbes, floating_tensors, in_backward
from .norms import ModuleNorms
from .optimizer_state import (FIRST_MOMENTS, MOMENT_ROWS, SECOND_MOMENTS,
                              float64_dots, moment_norms, moment_sums)
from .steps import StepProbe, build_step_probes, deepspeed_readable
from .summary import (PER_RANK, REPLICATED, largest_update_ratio, line_summary,
                      single_value_kind)

__all__ = [
    'ActivationProbes', 'in_backward', 'floating_tensors', 'StepProbe',
    'build_step_probes', 'deepspeed_readable', 'ModuleNorms', 'FIRST_MOMENTS',
    'SECOND_MOMENTS', 'MOMENT_ROWS', 'float64_dots', 'moment_sums',
    'moment_norms', 'line_summary', 'largest_update_ratio',
    'single_value_kind', 'REPLICATED', 'PER_RANK'
]
