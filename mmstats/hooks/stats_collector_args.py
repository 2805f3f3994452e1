# Copyright (c) mmstats contributors. All rights reserved.
"""StatsCollectorHook's argument checks: config mistakes fail when the hook
is built, naming the argument and the fix."""
import re
from typing import Dict, Optional, Sequence

from mmstats.stats import STAT_NAMES
from .log_rhythm import scope_inline_flags

NONFINITE_ACTIONS = ('warn', 'raise', 'ignore')
# train_step's outputs are reported under this prefix (kept apart from a
# model's own report() of the same name; published without it).
OUTPUTS_PREFIX = 'train_step/'
QUANTILE = re.compile(r'p(100|\d\d?(\.\d+)?)')  # 'p50', 'p99.9'


def _is_stat(stat) -> bool:
    return stat in STAT_NAMES or (isinstance(stat, str)
                                  and QUANTILE.fullmatch(stat) is not None)


def check_args(interval: Optional[int], flags: Dict[str, bool],
               stats: Sequence[str], log_stats: Sequence[str], prefix: str,
               on_nonfinite: str, regex: str) -> str:
    """Raise TypeError/ValueError naming a bad argument of
    StatsCollectorHook; return ``regex`` with its inline flags scoped."""
    if interval is not None and (not isinstance(interval, int) or isinstance(
            interval, bool) or interval <= 0):
        raise ValueError('StatsCollectorHook: interval must be None (the '
                         f'LoggerHook interval) or a positive int, got '
                         f'{interval!r}')
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f'StatsCollectorHook: {name} must be a bool '
                            f'(True or False), got {flag!r}')
    for name, value in (('stats', stats), ('log_stats', log_stats)):
        if isinstance(value, str) or not isinstance(
                value, Sequence) or not value or not all(
                    _is_stat(stat) for stat in value):
            raise ValueError(
                f'StatsCollectorHook: {name} must be a non-empty list '
                f'of {STAT_NAMES} or quantiles "pNN" (e.g. "p99"), e.g. '
                f'{name}=("mean",), got {value!r}')
    if not set(log_stats) <= set(stats):
        raise ValueError(f'StatsCollectorHook: log_stats {log_stats!r} '
                         f'must be a subset of stats {stats!r}')
    if not isinstance(prefix, str) or not prefix:
        raise ValueError('StatsCollectorHook: prefix must be a non-empty '
                         f'str, got {prefix!r}')
    if on_nonfinite not in NONFINITE_ACTIONS:
        raise ValueError('StatsCollectorHook: on_nonfinite must be one of'
                         f' {NONFINITE_ACTIONS}, got {on_nonfinite!r}')
    if not isinstance(regex, str):
        raise TypeError('StatsCollectorHook: regex must be a str, got '
                        f'{type(regex).__name__}')
    try:  # the user's pattern on its own: wrapping must not change it
        scoped = scope_inline_flags(regex)
        re.compile(scoped)
    except re.error as e:
        raise ValueError(f'StatsCollectorHook: regex {regex!r} is not a '
                         f'valid regular expression ({e}); inline flags '
                         'such as (?i) are allowed at its start') from None
    return scoped


def collector_patterns(scoped: str) -> Dict[str, str]:
    """The patterns of the train, val and test collectors around the user's
    (valid, flag-scoped) pattern ``scoped``: a valid pattern has balanced
    groups, so ``(?:...)`` keeps it whole. Training names may carry the
    prefix of ``train_step``'s outputs (``OUTPUTS_PREFIX``)."""
    return dict(
        train=rf'^(?!val/|test/)(?:{OUTPUTS_PREFIX})?(?:{scoped})$',
        val=rf'^val/(?:{scoped})$',
        test=rf'^test/(?:{scoped})$')


def check_log_regex(log_regex: str) -> 're.Pattern':
    """Compile ``log_regex`` or raise naming it."""
    if not isinstance(log_regex, str):
        raise TypeError('StatsCollectorHook: log_regex must be a str, got '
                        f'{type(log_regex).__name__}')
    try:
        return re.compile(log_regex)
    except re.error as e:
        raise ValueError(f'StatsCollectorHook: log_regex {log_regex!r} is '
                         f'not a valid regular expression ({e})') from None
