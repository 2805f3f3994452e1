# Copyright (c) mmstats contributors. All rights reserved.
"""The keys of StatsCollectorHook's statistics, name by name
(:class:`StatsLayout`: the published name of each collected one,
``train_step``'s outputs under their own names; ``<prefix>/<name>/<stat>``
for the visualizers, ``<name>/<stat>`` for LoggerHook's text line, the
message hub's history of ``hub_regex``, each decided once per name and
run), the collectors' patterns around the user's (:func:`collector_patterns`)
and what a one-value name publishes (:func:`one_value_stats`). The line
itself is written by :mod:`mmstats.publish.text_line`.
"""
from __future__ import annotations
import logging
import re
from typing import Any, Callable, Dict, Optional, Pattern, Sequence, Tuple

from mmengine.logging import HistoryBuffer, MessageHub, print_log

from .text_line import TIMING_NAMES, write_text_line

__all__ = [
    'one_value_stats', 'StatsLayout', 'NameMatch', 'collector_patterns',
    'OUTPUTS_PREFIX', 'HUB_HISTORY'
]

# train_step's outputs are reported under this prefix (kept apart from a
# model's own report() of the same name; published without it).
OUTPUTS_PREFIX = 'train_step/'
# History kept per message-hub key the hook writes (LogProcessor's default
# window): memory and cost per publication stay flat over a run.
HUB_HISTORY = 10
PHASE_PREFIX = re.compile(r'^(val|test)/')


def collector_patterns(scoped: str) -> Dict[str, str]:
    """The patterns of the train, val and test collectors around the user's
    (valid, flag-scoped) pattern ``scoped``: a valid pattern has balanced
    groups, so ``(?:...)`` keeps it whole. Training names may carry the
    prefix of ``train_step``'s outputs (``OUTPUTS_PREFIX``).

    Example:
        >>> collector_patterns('loss')['val']
        '^val/(?:loss)$'
    """
    return dict(
        train=rf'^(?!val/|test/)(?:{OUTPUTS_PREFIX})?(?:{scoped})$',
        val=rf'^val/(?:{scoped})$',
        test=rf'^test/(?:{scoped})$')


class NameMatch:
    """Whether ``regex`` matches a name without its ``val/``/``test/``
    (``re.fullmatch``), decided once per name.

    Example:
        >>> import re
        >>> match = NameMatch(re.compile('loss'))
        >>> match('val/loss'), match('loss_cls')
        (True, False)
    """

    def __init__(self, regex: Pattern) -> None:
        self.regex = regex
        self._seen: Dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        wanted = self._seen.get(name)
        if wanted is None:
            wanted = self._seen[name] = self.regex.fullmatch(
                PHASE_PREFIX.sub('', name)) is not None
        return wanted


class StatsLayout:
    """The published names and keys of one run's statistics.

    Args:
        prefix (str): The visualizers' and the hub history's keys are
            ``<prefix>/<name>/<stat>``.
        stats (Sequence[str]): The statistics published.
        log_stats (Sequence[str]): Those on the text line.
        log_regex (Pattern): Names (without ``val/``/``test/``) on the line.
        hub_regex (Pattern, optional): Names whose keys also go to the
            message hub with a history.
        flag_nonfinite (bool): Add a name's ``nonfinite`` count where it was
            seen (and is not published anyway).
        owner (str): Who warns. Defaults to 'StatsCollectorHook'.
        single_value (callable, optional): ``name -> 'replicated' |
            'per_rank' | None``: names that hold one value per publication
            (on all ranks, or on each) get only their value (the first of
            ``mean``, ``min``, ``max`` and the quantiles in ``stats``) and
            ``nonfinite``: a spread of one value cannot vary. None: no such
            names. Set before the first publication.
        world_size (int): Ranks: with several, a ``'per_rank'`` name keeps
            its spread over ranks. Defaults to 1.

    Attributes:
        nonfinite_names (set[str]): Names that got NaN/inf values this run.

    Example:
        >>> import re
        >>> layout = StatsLayout('stats', ('mean', 'max'), ('mean', ),
        ...                      re.compile('.*'), None, True)
        >>> results = layout.published(
        ...     {'train_step/loss': dict(mean=1., max=2., nonfinite=0)})
        >>> layout.scalars(results), layout.scalars(results, text=True)
        ({'stats/loss/mean': 1.0, 'stats/loss/max': 2.0}, {'loss/mean': 1.0})
        >>> layout.source('loss')
        'train_step/loss'
    """

    def __init__(self,
                 prefix: str,
                 stats: Sequence[str],
                 log_stats: Sequence[str],
                 log_regex: Pattern,
                 hub_regex: Optional[Pattern],
                 flag_nonfinite: bool,
                 owner: str = 'StatsCollectorHook',
                 single_value: Optional[Callable[[str], Optional[str]]] = None,
                 world_size: int = 1) -> None:
        self.prefix = prefix
        self.stats = tuple(stats)
        self.log_stats = tuple(log_stats)
        self.log_regex = log_regex
        self.flag_nonfinite = flag_nonfinite
        self.owner = owner
        self.single_value = single_value
        self.world_size = world_size
        self.nonfinite_names: set = set()
        self._hub = None if hub_regex is None else NameMatch(hub_regex)
        self._sources: Dict[str, str] = {}  # published name -> collector's
        self._merged_warned: set = set()
        self._keys: Dict[tuple, tuple] = {}  # (name, text) -> keys
        self._text_keys: Dict[str, set] = {}  # mode -> keys in the hub now
        self._seen_keys: set = set()  # shown by LogProcessor as they are

    def published(self, results: dict) -> dict:
        """``results`` under the published names: ``train_step``'s outputs
        under their own, unless the model reported the same name: then both
        stay apart (warned once)."""
        out = {}
        sources = self._sources
        for name, values in results.items():
            short = name[len(OUTPUTS_PREFIX):] if name.startswith(
                OUTPUTS_PREFIX) else None
            if short is None or short in results:
                out[name] = values
                sources[name] = name
                if short is not None and short not in self._merged_warned:
                    self._merged_warned.add(short)
                    print_log(
                        f'{self.owner}: the model reports {short!r}, '
                        f'which train_step also returns: published apart, '
                        f'the model\'s as {short!r} and train_step\'s as '
                        f"{name!r} (rename one, or collect=('timing', ))",
                        'current',
                        level=logging.WARNING)
            else:
                out[short] = values
                sources[short] = name
        return out

    def source(self, name: str) -> str:
        """The collector's name of published name ``name``."""
        return self._sources.get(name, name)

    def local_names(self, counts: Dict[str, Any],
                    published: Dict[str, Any]) -> Dict[str, Any]:
        """This rank's ``counts`` (by the collector's names) of the names
        in ``published``, under the published names."""
        local = {}
        for name, count in counts.items():
            if name not in published and name.startswith(OUTPUTS_PREFIX):
                name = name[len(OUTPUTS_PREFIX):]
            if name in published:
                local[name] = count
        return local

    def scalars(self, results: dict, text: bool = False) -> dict:
        """``{'<prefix>/<name>/<stat>': value}`` of ``stats``, or if
        ``text`` the log line's ``{'<name>/<stat>': value}`` of
        ``log_stats`` (max for timing; ``nonfinite`` where it was seen)."""
        scalars = {}
        layouts = self._keys
        # timing first: next to LoggerHook's time and data_time (rank 0's)
        names = [n for n in TIMING_NAMES if n in results]
        names += [n for n in results if n not in TIMING_NAMES]
        for name in names:
            layout = layouts.get((name, text))
            if layout is None:
                layout = layouts[(name, text)] = self._layout(name, text)
            keys, nonfinite_key = layout
            values = results[name]
            for key, stat in keys:
                value = values[stat]
                if value == value:  # skip NaN: nothing reported yet
                    scalars[key] = value
            if (self.flag_nonfinite and nonfinite_key is not None
                    and name in self.nonfinite_names):
                scalars[nonfinite_key] = values['nonfinite']
        return scalars

    def _layout(self, name: str, text: bool) -> tuple:
        """The keys of ``name`` (computed once per run): ``((key, stat),
        ...)`` and the key its ``nonfinite`` count takes where it was seen
        (None when ``nonfinite`` is published anyway)."""
        prefix = '' if text else f'{self.prefix}/'
        if text and name in TIMING_NAMES and 'max' in self.stats:
            stats = ('max', )  # the slowest rank's iteration
        elif text and not self.log_regex.fullmatch(PHASE_PREFIX.sub('', name)):
            stats = ()  # in scalars.json only (NaN counts still shown)
        else:
            stats = self.log_stats if text else self.stats
        kind = None if self.single_value is None else self.single_value(
            PHASE_PREFIX.sub('', name))
        if kind == 'replicated' or (kind == 'per_rank'
                                    and self.world_size == 1):
            stats = one_value_stats(self.stats, stats)
        keys = tuple((f'{prefix}{name}/{stat}', stat) for stat in stats)
        nonfinite = (None
                     if 'nonfinite' in stats else f'{prefix}{name}/nonfinite')
        return keys, nonfinite

    def to_hub_history(self, hub: MessageHub, scalars: dict) -> None:
        """The ``<prefix>/<name>/<stat>`` keys of the names ``hub_regex``
        matches, with a history of ``HUB_HISTORY`` values, into the message
        hub (mmengine's default keeps 1e6 and copies them on every update):
        flat memory and cost; nothing goes into checkpoints, so a resume
        warns about nothing."""
        if self._hub is None:
            return
        for key, value in scalars.items():
            if self._hub(key[len(self.prefix) + 1:key.rindex('/')]):
                buffer = hub.log_scalars.get(key)
                if buffer is None:
                    hub.log_scalars[key] = HistoryBuffer(
                        [value], [1], max_length=HUB_HISTORY)
                else:
                    buffer.update(value)

    def to_text_line(self, runner: Any, mode: str, text: dict) -> None:
        """Store ``text`` as ``<mode>/<key>`` in the message hub for
        LoggerHook to log, and take out the keys of the previous
        publication that have no value now (the line must not show a stale
        one): :func:`write_text_line`."""
        self._text_keys[mode] = write_text_line(
            runner, mode, text, self._text_keys.get(mode, set()),
            self._seen_keys)


def one_value_stats(stats: Sequence[str],
                    shown: Sequence[str]) -> Tuple[str, ...]:
    """Of ``shown`` (a subset of ``stats``), what a name holding one value
    per publication publishes: the value, under the first of ``mean``,
    ``min``, ``max`` and the quantiles in ``stats`` (each equals it), and
    ``nonfinite``; no ``std`` or ``num`` (they cannot vary).

    Example:
        >>> one_value_stats(('mean', 'std', 'min', 'max'),
        ...                 ('mean', 'std', 'min', 'max'))
        ('mean',)
        >>> one_value_stats(('max', 'p50', 'nonfinite'), ('max', 'nonfinite'))
        ('max', 'nonfinite')
    """
    value = next((s for s in ('mean', 'min', 'max') if s in stats),
                 next((s for s in stats if s.startswith('p')), None))
    return tuple(s for s in shown if s == value or s == 'nonfinite')
