# Copyright (c) mmstats contributors. All rights reserved.
"""StatsCollectorHook's argument checks: a config mistake fails when the
hook is built, a wrong type with a TypeError, a wrong value with a
ValueError, the message naming the argument and the fix
(:mod:`mmstats.utils.args`). The health options are
:class:`mmstats.health.HealthConfig`'s; the keywords of earlier releases
(the flat health options, ``collect_outputs``/``collect_timing``) are
folded into ``health=dict(...)`` and ``collect=(...)`` here
(:func:`accept_deprecated_keywords`).
"""
import difflib
import functools
import inspect
import logging
import re
from typing import Any, Dict, Optional, Pattern, Sequence, Tuple

from mmengine.logging import print_log

from mmstats.health import HealthConfig, fold_flat_health
from mmstats.stats import STAT_NAMES
from mmstats.utils.args import (check_bool, check_log_interval, check_names,
                                check_positive_int, check_str, compile_regex,
                                deprecation_message, keywords_text,
                                scope_inline_flags)

__all__ = [
    'is_stat', 'check_collector_args', 'check_collect',
    'accept_deprecated_keywords', 'optional_regex', 'quantile_levels',
    'COLLECTABLE'
]

OWNER = 'StatsCollectorHook'
QUANTILE = re.compile(r'p(100|\d\d?(\.\d+)?)')  # 'p50', 'p99.9'
#: what the hook reports itself (``collect``): what ``train_step`` returns,
#: every rank's iteration times
COLLECTABLE = ('outputs', 'timing')
#: the deprecated keywords of ``collect`` (before 0.3): one flag per source
FLAT_COLLECT = tuple(f'collect_{source}' for source in COLLECTABLE)


def is_stat(stat: Any) -> bool:
    """Whether ``stat`` is a statistic StatsCollectorHook publishes.

    Example:
        >>> is_stat('p99.9'), is_stat('median')
        (True, False)
    """
    return stat in STAT_NAMES or (isinstance(stat, str)
                                  and QUANTILE.fullmatch(stat) is not None)


def check_collector_args(interval: Optional[int], stats: Sequence[str],
                         log_stats: Sequence[str], prefix: str, regex: str,
                         max_names: int, **flags: bool) -> str:
    """Raise TypeError (a wrong type) or ValueError (a wrong value) naming
    a bad argument of StatsCollectorHook (:mod:`mmstats.utils.args`),
    ``flags`` the ones that must be True or False; return ``regex`` with
    its inline flags scoped.

    Example:
        >>> check_collector_args(None, ('mean', ), ('mean', ), 'stats',
        ...                      '(?i)loss', 10, by_epoch=False)
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
    check_positive_int(OWNER, 'max_names', max_names, example=1000)
    # the user's pattern on its own: wrapping must not change it
    return compile_regex(
        OWNER,
        'regex',
        regex,
        prepare=scope_inline_flags,
        hint='; inline flags such as (?i) are allowed at its start').pattern


def check_collect(collect: Any) -> Tuple[str, ...]:
    """``collect`` as a tuple if it is a list of :data:`COLLECTABLE` (an
    empty one collects only what ``report()`` gets); else a TypeError or
    ValueError naming the argument and the fix.

    Example:
        >>> check_collect(['timing'])
        ('timing',)
        >>> check_collect('timing')
        Traceback (most recent call last):
        TypeError: StatsCollectorHook: collect must be a list of \
('outputs', 'timing'), e.g. collect=('timing', ), got 'timing' of type str
    """
    what = f"a list of {COLLECTABLE}, e.g. collect=('timing', )"
    if isinstance(collect, str) or not isinstance(collect, Sequence):
        raise TypeError(f'{OWNER}: collect must be {what}, got {collect!r} '
                        f'of type {type(collect).__name__}')
    unknown = [source for source in collect if source not in COLLECTABLE]
    if unknown:
        raise ValueError(
            f'{OWNER}: collect must be {what}, got {tuple(collect)!r} '
            f'({unknown[0]!r} is none of them)')
    return tuple(collect)


def _fold_flat_collect(kwargs: Dict[str, Any]) -> None:
    """Replace the deprecated ``collect_outputs``/``collect_timing`` flags
    in ``kwargs`` by ``collect=(...)``, with one mmengine WARNING naming
    the new form; both forms at once are a ValueError."""
    flat = {name: kwargs.pop(name) for name in FLAT_COLLECT if name in kwargs}
    if not flat:
        return
    for name, flag in flat.items():
        check_bool(OWNER, name, flag)
    if 'collect' in kwargs:
        raise ValueError(f'{OWNER}: {keywords_text(flat)} (deprecated) and '
                         f'collect={kwargs["collect"]!r} are both given; '
                         f'write collect=... alone')
    kwargs['collect'] = tuple(
        source for source, name in zip(COLLECTABLE, FLAT_COLLECT)
        if flat.get(name, True))
    print_log(
        deprecation_message(OWNER, flat, f'collect={kwargs["collect"]!r}'),
        'current',
        level=logging.WARNING)


def accept_deprecated_keywords(cls: type) -> type:
    """Class decorator of StatsCollectorHook: its keywords of earlier
    releases are folded into the new arguments with one mmengine WARNING
    naming the new form, before the keywords are checked
    (``check_keywords``: any other unknown keyword is refused naming the
    closest argument, a misspelt health option here, in the new form):
    the flat health options (``spike_factor=8``) into
    ``health=dict(spike_factor=8)``
    (:func:`mmstats.health.fold_flat_health`), ``collect_outputs`` and
    ``collect_timing`` into ``collect=(...)``. Both forms at once are a
    ValueError.

    Example:
        >>> @accept_deprecated_keywords
        ... class MyHook:
        ...     def __init__(self, collect=COLLECTABLE, health=None):
        ...         self.collect, self.health = collect, health
        >>> MyHook(health=dict(spike_factor=8)).health
        {'spike_factor': 8}
    """
    init = cls.__init__
    params = list(inspect.signature(init).parameters)[1:]  # self

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        options = HealthConfig.names()
        _fold_flat_collect(kwargs)
        for name in kwargs:  # a misspelt health option: in the new form
            if name in params or name in options:
                continue
            close = difflib.get_close_matches(name, params + list(options), 1)
            if close and close[0] in options:
                raise TypeError(
                    f'{cls.__name__}: unexpected keyword argument {name!r}; '
                    f'did you mean health=dict({close[0]}=...)? '
                    f'{cls.__name__} takes {", ".join(params)}')
        flat = {name: kwargs.pop(name) for name in options if name in kwargs}
        if flat:
            kwargs['health'] = fold_flat_health(kwargs.get('health'), flat)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


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
