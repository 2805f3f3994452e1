# Copyright (c) mmstats contributors. All rights reserved.
"""What a publication of module statistics says on the log line, and which
of its names hold one value per publication (``docs/module_stats.md``).

The full statistics of every module go to ``scalars.json`` and
TensorBoard; the log line gets two numbers a person watches: the total
gradient norm (per optimizer of an ``OptimWrapperDict``) and the largest
update ratio, under one key for the whole run (``max_update_ratio``: a
key that named its module split the curve in two whenever another module
took the lead); which module holds it is said in words
(:func:`largest_update_ratio`; ModuleStatsHook logs it when it changes).
A norm, a ratio or a cosine is one value per publication, the same on
every rank (the norms of the full tensors): its spread over ranks cannot
vary, so only its value is published (:func:`single_value_kind`).
"""
from __future__ import annotations
import math
import re
from typing import Dict, Mapping, Optional, Tuple

__all__ = [
    'line_summary', 'largest_update_ratio', 'single_value_kind', 'REPLICATED',
    'PER_RANK'
]

#: one value per publication, the same on every rank
REPLICATED = 'replicated'
#: one value per publication on each rank (its spread is over ranks)
PER_RANK = 'per_rank'

# <module>/<stat> of a value per publication: the step probes' norms,
# ratios and the optimizer state's norms and cosines
_PER_MODULE = re.compile(r'.+/(grad_norm|weight_norm|update_ratio|'
                         r'exp_avg_norm|exp_avg_cos|exp_avg_sq_sqrt_norm|'
                         r'momentum_buffer_norm|momentum_buffer_cos)')
#: a module and its value
Leader = Tuple[str, float]
_TOTAL = re.compile(r'total_grad_norm(\..+)?|amp_skipped_steps')


def single_value_kind(name: str, prefix: str = 'modules') -> Optional[str]:
    """Whether ModuleStatsHook's reported ``name`` is one value per
    publication: :data:`REPLICATED` (norms, ratios, cosines, the skipped
    AMP steps: the same on every rank), :data:`PER_RANK`
    (``instrument_ms``: each rank's own) or None (``act``: every output
    element; any name not under ``prefix``).

    Example:
        >>> single_value_kind('modules/backbone.layer1/grad_norm')
        'replicated'
        >>> single_value_kind('modules/instrument_ms')
        'per_rank'
        >>> single_value_kind('modules/backbone.layer1/act') is None
        True
    """
    head = f'{prefix}/'
    if not name.startswith(head):
        return None
    rest = name[len(head):]
    if rest == 'instrument_ms':
        return PER_RANK
    if _TOTAL.fullmatch(rest) or _PER_MODULE.fullmatch(rest):
        return REPLICATED
    return None


def line_summary(results: Mapping[str, Mapping[str, float]],
                 prefix: str = 'modules') -> Dict[str, float]:
    """The log line's summary of one publication's module statistics
    (``results``: ``{name: {'mean': ...}}`` over all ranks): the total
    gradient norm(s) under their own names and the largest update ratio as
    ``<prefix>/max_update_ratio`` (its module: :func:`largest_update_ratio`).
    No key holds a module's name: the keys are the same all run.

    Example:
        >>> line_summary({
        ...     'modules/total_grad_norm': {'mean': 2.5},
        ...     'modules/head/update_ratio': {'mean': 0.01},
        ...     'modules/stem/update_ratio': {'mean': 0.03},
        ...     'modules/stem/act': {'mean': 0.2}})
        {'modules/total_grad_norm': 2.5, 'modules/max_update_ratio': 0.03}
    """
    head = f'{prefix}/'
    summary = {
        name: results[name]['mean']
        for name in sorted(results)
        if name.startswith(f'{head}total_grad_norm')
    }
    largest = largest_update_ratio(results, prefix)
    if largest is not None:
        summary[f'{head}max_update_ratio'] = largest[1]
    return summary


def largest_update_ratio(results: Mapping[str, Mapping[str, float]],
                         prefix: str = 'modules') -> Optional[Leader]:
    """``(module, ratio)`` of the largest update ratio of a publication, or
    None without one. A non-finite ratio wins over every finite one (the
    first such module by name): a finite maximum never hides a NaN.

    Example:
        >>> largest_update_ratio({
        ...     'modules/head/update_ratio': {'mean': 0.01},
        ...     'modules/stem/update_ratio': {'mean': float('nan')}})
        ('stem', nan)
    """
    head = f'{prefix}/'
    largest = None  # (sort key, module, value)
    for name in sorted(results):
        if not (name.startswith(head) and name.endswith('/update_ratio')):
            continue
        module = name[len(head):-len('/update_ratio')]
        value = results[name]['mean']
        key = (not math.isfinite(value),
               value if math.isfinite(value) else 0.0)
        if largest is None or key > largest[0]:
            largest = (key, module, value)
    return None if largest is None else (largest[1], largest[2])
