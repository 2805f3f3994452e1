# Copyright (c) mmstats contributors. All rights reserved.
"""StatsCollectorHook's argument checks: a config mistake fails when the
hook is built, a wrong type with a TypeError, a wrong value with a
ValueError, the message naming the argument and the fix
(:mod:`mmstats.utils.args`).
"""
import math
import re
from typing import Any, Dict, Optional, Pattern, Sequence

from mmstats.stats import STAT_NAMES
from mmstats.utils.args import (check_bool, check_choice, check_log_interval,
                                check_names, check_positive_int, check_real,
                                check_str, compile_regex, scope_inline_flags)

__all__ = [
    'is_stat', 'check_collector_args', 'check_health_args', 'optional_regex',
    'quantile_levels'
]

OWNER = 'StatsCollectorHook'
NONFINITE_ACTIONS = ('warn', 'raise', 'ignore')
SPIKE_ACTIONS = ('warn', 'raise')
SPIKE_STATS = ('max', 'mean')
QUANTILE = re.compile(r'p(100|\d\d?(\.\d+)?)')  # 'p50', 'p99.9'


def is_stat(stat: Any) -> bool:
    """Whether ``stat`` is a statistic StatsCollectorHook publishes.

    Example:
        >>> is_stat('p99.9'), is_stat('median')
        (True, False)
    """
    return stat in STAT_NAMES or (isinstance(stat, str)
                                  and QUANTILE.fullmatch(stat) is not None)


def check_collector_args(interval: Optional[int], flags: Dict[str, bool],
                         stats: Sequence[str], log_stats: Sequence[str],
                         prefix: str, on_nonfinite: str, regex: str,
                         max_names: int) -> str:
    """Raise TypeError (a wrong type) or ValueError (a wrong value) naming
    a bad argument of StatsCollectorHook (:mod:`mmstats.utils.args`);
    return ``regex`` with its inline flags scoped.

    Example:
        >>> check_collector_args(None, {'by_epoch': False}, ('mean', ),
        ...                      ('mean', ), 'stats', 'warn', '(?i)loss', 10)
        '(?i:loss)'
    """
    check_log_interval(OWNER, interval)
    for name, flag in flags.items():
        check_bool(OWNER, name, flag)
    for name, value in (('stats', stats), ('log_stats', log_stats)):
        check_names(
            OWNER, name, value, is_stat,
            f'a non-empty list of {STAT_NAMES} or quantiles "pNN" (e.g. '
            f'"p99"), e.g. {name}=("mean",)')
    if not set(log_stats) <= set(stats):
        raise ValueError(f'{OWNER}: log_stats {log_stats!r} '
                         f'must be a subset of stats {stats!r}')
    check_str(OWNER, 'prefix', prefix, 'stats')
    check_choice(OWNER, 'on_nonfinite', on_nonfinite, NONFINITE_ACTIONS)
    check_positive_int(OWNER, 'max_names', max_names, example=1000)
    # the user's pattern on its own: wrapping must not change it
    return compile_regex(
        OWNER,
        'regex',
        regex,
        prepare=scope_inline_flags,
        hint='; inline flags such as (?i) are allowed at its start').pattern


def check_health_args(spike_stat: str, spike_factor: float, spike_window: int,
                      on_spike: str, histogram_regex: Optional[str],
                      histogram_buckets: int, sketching: bool) -> None:
    """Check the spike and histogram arguments (as
    :func:`check_collector_args`): ``histogram_regex`` needs quantile
    sketches (``sketching``).

    Example:
        >>> check_health_args('max', 1., 20, 'warn', None, 512, False)
        Traceback (most recent call last):
        ValueError: StatsCollectorHook: spike_factor must be a finite number \
> 1 (e.g. spike_factor=4.0), got 1.0
    """
    check_choice(OWNER, 'spike_stat', spike_stat, SPIKE_STATS)
    check_choice(OWNER, 'on_spike', on_spike, SPIKE_ACTIONS)
    check_real(OWNER, 'spike_factor', spike_factor,
               lambda v: v > 1 and math.isfinite(v),
               'a finite number > 1 (e.g. spike_factor=4.0)')
    check_positive_int(OWNER, 'spike_window', spike_window, example=20)
    check_positive_int(
        OWNER, 'histogram_buckets', histogram_buckets, example=512)
    if histogram_regex is not None and not sketching:
        raise ValueError(
            f'{OWNER}: histogram_regex={histogram_regex!r} needs quantile '
            'sketches, which only a quantile in stats switches on: add one, '
            'e.g. stats=(\'mean\', \'std\', \'min\', \'max\', '
            '\'p50\'), or set histogram_regex=None')


def optional_regex(name: str, regex: Optional[str]) -> Optional[Pattern]:
    """``regex`` compiled (a bad one raises, naming argument ``name``), or
    None.

    Example:
        >>> optional_regex('hub_regex', None) is None
        True
        >>> optional_regex('hub_regex', 'loss').pattern
        'loss'
    """
    return None if regex is None else compile_regex(OWNER, name, regex)


def quantile_levels(stats: Sequence[str]) -> Dict[str, float]:
    """The quantiles among ``stats`` (checked), by name.

    Example:
        >>> quantile_levels(('mean', 'p50', 'p99'))
        {'p50': 0.5, 'p99': 0.99}
    """
    return {
        stat: float(stat[1:]) / 100
        for stat in stats if stat not in STAT_NAMES
    }
