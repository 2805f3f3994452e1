# Copyright (c) mmstats contributors. All rights reserved.
"""StatsCollectorHook's health options, ``health=dict(...)``: checked
when the hook is built, a wrong type with a TypeError, a wrong value with
a ValueError, the message naming the option and the fix
(:mod:`mmstats.utils.args`). :class:`~.policy.HealthPolicy` acts on them.
"""
import difflib
import logging
import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Optional, Union

from mmengine.logging import print_log

from mmstats.utils.args import (check_choice, check_positive_int, check_real,
                                compile_regex, deprecation_message,
                                keywords_text)
from .histograms import MAX_BUCKETS

__all__ = ['HealthConfig', 'fold_flat_health']

OWNER = 'StatsCollectorHook'
NONFINITE_ACTIONS = ('warn', 'raise', 'ignore')
SPIKE_ACTIONS = ('warn', 'raise')
SPIKE_STATS = ('max', 'mean')


def _example(name: str, value: Any) -> str:
    """``'e.g. health=dict(name=value)'``: the fix in the new form."""
    return f'e.g. health=dict({name}={value!r})'


@dataclass(frozen=True)
class HealthConfig:
    """What StatsCollectorHook checks about the health of what it
    publishes, and what it does then (``docs/nonfinite.md``,
    ``docs/spikes_histograms.md``). Built from ``health=dict(...)`` by
    :meth:`build`; every option is checked here.

    Args:
        on_nonfinite (str): When a name got NaN/inf values in an interval:
            ``'warn'`` (its ``nonfinite`` count joins the log line and one
            warning names it), ``'raise'`` (every rank raises
            ``FloatingPointError`` at the same iteration) or ``'ignore'``.
            Defaults to ``'warn'``.
        spike_regex (str, optional): Training names (``re.fullmatch``)
            watched for spikes: a publication whose ``spike_stat`` over all
            ranks exceeds ``spike_factor`` times the median of the name's
            last ``spike_window`` publications (at least 5 of them) warns,
            naming the rank that reported the largest value (one small
            collective, only when a name spikes), or raises. None: off (no
            work). The histories are saved with checkpoints and continue
            after a resume. Defaults to ``'loss'``, ``train_step``'s total
            loss.
        spike_stat (str): ``'max'`` (the interval's largest value: a
            single bad batch on a single rank) or ``'mean'``. Defaults to
            ``'max'``.
        spike_factor (float): A value above this many times the median
            of its history spikes (> 1). Defaults to 4.
        spike_window (int): Publications of history per watched name.
            Defaults to 20.
        on_spike (str): ``'warn'`` (one warning per publication) or
            ``'raise'`` (:class:`~mmstats.health.SpikeError` on every
            rank at the same iteration, after that publication's
            statistics were written). Defaults to ``'warn'``.
        histogram_regex (str, optional): Names (without ``val/``/``test/``;
            ``re.fullmatch``) whose all-rank histogram, made from the merged
            quantile sketch (``stats`` must hold a quantile), goes to
            TensorBoard and W&B as ``<prefix>/<name>/hist`` at every
            publication where they got values. None: off. Defaults to None.
        histogram_buckets (int): At most this many buckets per histogram
            (adjacent ones merged beyond): at most 16 B each per name and
            publication in the event file. Defaults to 512 (W&B's limit).

    Example:
        >>> config = HealthConfig.build(dict(spike_factor=8))
        >>> config.spike_factor, config.on_spike
        (8, 'warn')
        >>> HealthConfig.build(dict(spike_factr=8))
        Traceback (most recent call last):
        TypeError: StatsCollectorHook: health got an unexpected key \
'spike_factr'; did you mean spike_factor? health takes on_nonfinite, \
spike_regex, spike_stat, spike_factor, spike_window, on_spike, \
histogram_regex, histogram_buckets
    """
    on_nonfinite: str = 'warn'
    spike_regex: Optional[str] = 'loss'
    spike_stat: str = 'max'
    spike_factor: float = 4.
    spike_window: int = 20
    on_spike: str = 'warn'
    histogram_regex: Optional[str] = None
    histogram_buckets: int = MAX_BUCKETS

    def __post_init__(self) -> None:
        check_choice(OWNER, 'on_nonfinite', self.on_nonfinite,
                     NONFINITE_ACTIONS)
        check_choice(OWNER, 'spike_stat', self.spike_stat, SPIKE_STATS)
        check_choice(OWNER, 'on_spike', self.on_spike, SPIKE_ACTIONS)
        check_real(OWNER, 'spike_factor', self.spike_factor,
                   lambda v: v > 1 and math.isfinite(v),
                   f'a finite number > 1 ({_example("spike_factor", 4.)})')
        for name, example in (('spike_window', 20), ('histogram_buckets',
                                                     MAX_BUCKETS)):
            check_positive_int(
                OWNER,
                name,
                getattr(self, name),
                meaning=_example(name, example))
        for name in ('spike_regex', 'histogram_regex'):
            if getattr(self, name) is not None:
                compile_regex(OWNER, name, getattr(self, name))

    @classmethod
    def names(cls) -> tuple:
        """The options, in their order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def build(cls, health: Union[None, Mapping[str, Any],
                                 'HealthConfig']) -> 'HealthConfig':
        """A :class:`HealthConfig` from ``health=dict(...)`` (None: the
        defaults; a HealthConfig as it is). A key it does not take is a
        TypeError naming the closest one."""
        if health is None or isinstance(health, HealthConfig):
            return health or cls()
        if not isinstance(health, Mapping):
            raise TypeError(f'{OWNER}: health must be None or a dict of '
                            f'{", ".join(cls.names())} (e.g. health=dict('
                            f"on_nonfinite='raise')), got {health!r} of type "
                            f'{type(health).__name__}')
        for key in health:
            if key not in cls.names():
                close = difflib.get_close_matches(
                    str(key), cls.names(), n=1, cutoff=0.6)
                hint = f'did you mean {close[0]}? ' if close else ''
                raise TypeError(
                    f'{OWNER}: health got an unexpected key {key!r}; {hint}'
                    f'health takes {", ".join(cls.names())}')
        return cls(**health)

    def check_sketching(self, sketching: bool) -> None:
        """Raise ValueError if ``histogram_regex`` is set without the
        quantile sketches (a quantile in ``stats``) it is drawn from.

        Example:
            >>> HealthConfig(histogram_regex='loss').check_sketching(False)
            Traceback (most recent call last):
            ValueError: StatsCollectorHook: histogram_regex='loss' needs \
quantile sketches, which only a quantile in stats switches on: add one, e.g. \
stats=('mean', 'std', 'min', 'max', 'p50'), or leave histogram_regex out of \
health
        """
        if self.histogram_regex is not None and not sketching:
            raise ValueError(
                f'{OWNER}: histogram_regex={self.histogram_regex!r} needs '
                'quantile sketches, which only a quantile in stats switches '
                "on: add one, e.g. stats=('mean', 'std', 'min', 'max', "
                "'p50'), or leave histogram_regex out of health")


def fold_flat_health(health: Any, flat: Mapping[str, Any]) -> Any:
    """``health`` with the deprecated flat keywords ``flat`` (e.g.
    ``spike_factor=8``, StatsCollectorHook's arguments before
    ``health=dict(...)``) folded in, with one mmengine WARNING naming the
    new form (mmengine's hooks warn so about deprecated arguments: it is
    in the log, where a ``DeprecationWarning`` is hidden by Python's
    default filters). Both forms at once are a ValueError naming both.

    Example:
        >>> fold_flat_health(None, {}) is None
        True
        >>> fold_flat_health(dict(on_spike='raise'), dict(spike_factor=8))
        Traceback (most recent call last):
        ValueError: StatsCollectorHook: spike_factor=8 (deprecated) and \
health={'on_spike': 'raise'} are both given; write them in one: \
health=dict(on_spike='raise', spike_factor=8)
    """
    if not flat:
        return health
    if health is not None:
        given = (
            asdict(health) if isinstance(health, HealthConfig) else
            dict(health) if isinstance(health, Mapping) else {})
        raise ValueError(
            f'{OWNER}: {keywords_text(flat)} (deprecated) and '
            f'health={health!r} are both given; write them in '
            f'one: health=dict({keywords_text({**given, **flat})})')
    print_log(
        deprecation_message(OWNER, flat,
                            f'health=dict({keywords_text(flat)})'),
        'current',
        level=logging.WARNING)
    return dict(flat)
