# Copyright (c) mmstats contributors. All rights reserved.
"""StatsCollectorHook's argument checks: config mistakes fail when the hook
is built, naming the argument and the fix."""
import re
from typing import Any, Dict, Optional, Sequence

from mmstats.stats import STAT_NAMES
from mmstats.utils.args import (check_bool, check_choice, check_positive_int,
                                check_str, compile_regex)
from .log_rhythm import scope_inline_flags

OWNER = 'StatsCollectorHook'

NONFINITE_ACTIONS = ('warn', 'raise', 'ignore')
# train_step's outputs are reported under this prefix (kept apart from a
# model's own report() of the same name; published without it).
OUTPUTS_PREFIX = 'train_step/'
QUANTILE = re.compile(r'p(100|\d\d?(\.\d+)?)')  # 'p50', 'p99.9'


def _is_stat(stat) -> bool:
    return stat in STAT_NAMES or (isinstance(stat, str)
                                  and QUANTILE.fullmatch(stat) is not None)


def _check_stats(name: str, value: Any) -> None:
    what = (f'a non-empty list of {STAT_NAMES} or quantiles "pNN" (e.g. '
            f'"p99"), e.g. {name}=("mean",)')
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f'{OWNER}: {name} must be {what}, got {value!r} of '
                        f'type {type(value).__name__}')
    if not value or not all(_is_stat(stat) for stat in value):
        raise ValueError(f'{OWNER}: {name} must be {what}, got {value!r}')


def check_args(interval: Optional[int], flags: Dict[str, bool],
               stats: Sequence[str], log_stats: Sequence[str], prefix: str,
               on_nonfinite: str, regex: str, max_names: int) -> str:
    """Raise TypeError (a wrong type) or ValueError (a wrong value) naming
    a bad argument of StatsCollectorHook (:mod:`mmstats.utils.args`);
    return ``regex`` with its inline flags scoped."""
    check_positive_int(
        OWNER,
        'interval',
        interval,
        example=10,
        none_ok=True,
        meaning='None: the LoggerHook interval')
    for name, flag in flags.items():
        check_bool(OWNER, name, flag)
    for name, value in (('stats', stats), ('log_stats', log_stats)):
        _check_stats(name, value)
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
    return compile_regex(OWNER, 'log_regex', log_regex)
