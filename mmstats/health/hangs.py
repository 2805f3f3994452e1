# Copyright (c) mmstats contributors. All rights reserved.
"""What the hang watch knows and decides, without threads or a Runner
(``docs/hangs.md``): each rank's progress (:class:`Progress`: the
iteration and phase it is in, O(1) host work per phase change), the
options (:class:`HangConfig`: the timeout of each phase, derived from the
run's own phase times or given), the stall rule (:func:`find_stall`: the
ranks *behind* all others, over their timeout) and the ERROR line
(:func:`hang_message`). :mod:`.hang_watchdog` runs them on a thread.
"""
import json
import math
import os.path as osp
import time
from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, List, Mapping, NamedTuple, Optional,
                    Tuple, Union)

from mmstats.utils.args import check_choice, check_real

__all__ = [
    'PHASES', 'HANG_EXIT_CODE', 'HangConfig', 'Progress', 'RankRecord',
    'Stall', 'find_stall', 'hang_message', 'dump_path'
]

OWNER = 'HangWatchHook'
#: the phases a rank is in (``docs/hangs.md``); ``hook`` carries the hook's
#: class and method as its detail
PHASES = ('setup', 'data', 'forward', 'backward', 'optimizer_step', 'hook',
          'validation', 'test', 'checkpoint_save', 'precise_bn')
#: the exit status of every rank that ends a hung run (``on_hang='exit'``):
#: distinct from sysexits (64-78), from 128 + a signal and from torchrun's 1
HANG_EXIT_CODE = 114
#: ``'auto'``: a phase gets this many times the longest it took before
AUTO_FACTOR = 10
#: ``'auto'``: a phase never completed in this run (the first iteration,
#: validation, save, PreciseBN recomputation, the data loader's start) gets
#: this many floors
FIRST_FACTORS = 3
ACTIONS = ('warn', 'exit')

Timeout = Union[None, str, float]


def _check_timeout(name: str, value: Any) -> Timeout:
    if value is None or value == 'auto':
        return value
    return check_real(
        OWNER, name, value, lambda v: v > 0 and math.isfinite(v),
        "None, 'auto' or a number of seconds > 0 (e.g. timeout=600, or "
        "timeout=dict(default='auto', checkpoint_save=3600))")


@dataclass(frozen=True)
class HangConfig:
    """When a rank counts as stalled, and what the run does then.

    Args:
        timeout (None, str, float or dict): Seconds a rank may stay in one
            phase. ``'auto'``: ``max(floor, 10 x`` the longest this phase
            (a hook: this hook's method) took before in this run, its first
            occurrence left out``)``; a phase that has not completed yet
            gets ``3 x floor`` (the first iteration compiles and
            benchmarks, the first save creates files). A number: that many
            seconds in every phase. None: the watch is off. A dict sets
            phases (keys of :data:`PHASES`) and ``default`` (the others),
            e.g. ``dict(default='auto', checkpoint_save=3600,
            validation=None)``. Defaults to ``'auto'``.
        on_hang (str): ``'warn'``: one ERROR line, repeated at most every
            ``repeat`` seconds while the stall lasts, and keep waiting.
            ``'exit'``: the line, then every rank that can still act
            exits with :data:`HANG_EXIT_CODE`. Defaults to ``'warn'``.
        floor (float): Seconds, the least ``'auto'`` timeout. Defaults to
            300.
        interval (float): Seconds between a rank's writes of its progress
            (only when it changed) and rank 0's looks at all of them.
            Defaults to 5.
        repeat (float): Seconds, the least time between two ERROR lines
            about the same stall. Defaults to 300.

    Example:
        >>> config = HangConfig.build(dict(timeout=dict(data=60)))
        >>> config.timeout_of('data', None), config.timeout_of('hook', 2.)
        (60, 300.0)
        >>> config.timeout_of('validation', None)  # first occurrence
        900.0
        >>> HangConfig.build(dict(on_hang='abort'))
        Traceback (most recent call last):
        ValueError: HangWatchHook: on_hang must be one of ('warn', 'exit'), \
got 'abort'
    """
    timeout: Any = 'auto'
    on_hang: str = 'warn'
    floor: float = 300.
    interval: float = 5.
    repeat: float = 300.
    timeouts: Dict[str, Timeout] = field(
        default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_choice(OWNER, 'on_hang', self.on_hang, ACTIONS)
        for name in ('floor', 'interval', 'repeat'):
            check_real(OWNER, name, getattr(self, name),
                       lambda v: v > 0 and math.isfinite(v),
                       f'a number of seconds > 0 (e.g. {name}=5)')
        given = self.timeout
        if isinstance(given, Mapping):
            unknown = sorted(set(given) - set(PHASES) - {'default'})
            if unknown:
                raise ValueError(
                    f'{OWNER}: timeout got unknown phases {unknown}; it '
                    f'takes default, {", ".join(PHASES)}')
            table = {'default': 'auto', **given}
        else:
            table = {'default': given}
        if not (isinstance(given, Mapping) or given is None
                or given == 'auto'):
            _check_timeout('timeout', given)
        for key, value in table.items():
            self.timeouts[key] = _check_timeout(f'timeout[{key!r}]', value)

    @classmethod
    def build(cls, options: Optional[Mapping[str, Any]]) -> 'HangConfig':
        """A :class:`HangConfig` from the hook's keywords (None: the
        defaults)."""
        return cls(**dict(options or {}))

    @property
    def enabled(self) -> bool:
        """Whether any phase has a timeout."""
        return any(v is not None for v in self.timeouts.values())

    def timeout_of(self, phase: str,
                   longest: Optional[float]) -> Optional[float]:
        """The timeout of ``phase`` given the longest it took before (its
        first occurrence left out; None: it has not completed yet)."""
        value = self.timeouts.get(phase, self.timeouts['default'])
        if value != 'auto':
            return value
        if longest is None:
            return FIRST_FACTORS * self.floor
        return max(self.floor, AUTO_FACTOR * longest)


class Progress:
    """Where this rank is: ``state = (iteration, seq, phase, detail,
    since)``, replaced as one tuple (a reader on another thread never sees
    half of it); ``seq`` counts the phase changes since the iteration
    began, the same on every rank, so ``(iteration, seq)`` orders ranks.
    :meth:`enter` is the whole hot path: one clock read, two dict look-ups.

    The longest time of each phase leaves out its first occurrence and
    any occurrence longer than its timeout then (``timeout_of``): a rank
    that waited for a stalled one does not raise its own timeouts.

    Args:
        timeout_of (callable, optional): :meth:`HangConfig.timeout_of`.
            Defaults to None (every duration kept).
        clock (callable): Wall time. Defaults to ``time.time``.

    Example:
        >>> progress = Progress(clock=iter(range(100)).__next__)
        >>> progress.enter('data', iteration=0)
        >>> progress.enter('forward')
        >>> progress.state
        (0, 1, 'forward', '', 2)
        >>> progress.enter('data', iteration=1)
        >>> progress.enter('forward')
        >>> progress.longest_of('forward', '')  # first left out
        0.0
        >>> progress.enter('data', iteration=2)
        >>> progress.longest_of('forward', '')
        1
    """
    __slots__ = ('state', 'completed', 'longest', '_clock', '_timeout_of')

    def __init__(self,
                 timeout_of: Optional[Callable] = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._timeout_of = timeout_of
        #: (phase, detail) -> times completed, and the longest duration
        self.completed: Dict[Tuple[str, str], int] = {}
        self.longest: Dict[Tuple[str, str], float] = {}
        self.state: Tuple[int, int, str, str,
                          float] = (-1, 0, 'setup', '', clock())

    def enter(self,
              phase: str,
              detail: str = '',
              iteration: Optional[int] = None) -> None:
        """Leave the current phase (its duration kept) and enter
        ``phase``; a new ``iteration`` restarts ``seq``."""
        now = self._clock()
        it, seq, old, old_detail, since = self.state
        key = (old, old_detail)
        done = self.completed.get(key, 0)
        if done and now - since > self.longest.get(key, 0.):
            self._keep(key, now - since)
        self.completed[key] = done + 1
        if iteration is None or iteration == it:
            self.state = (it, seq + 1, phase, detail, now)
        else:
            self.state = (iteration, 0, phase, detail, now)

    def _keep(self, key: Tuple[str, str], seconds: float) -> None:
        """A new longest, unless it overran its timeout."""
        limit = None if self._timeout_of is None else self._timeout_of(
            key[0], self.longest.get(key, 0.))
        if limit is None or seconds <= limit:
            self.longest[key] = seconds

    def longest_of(self, phase: str, detail: str) -> Optional[float]:
        """The longest ``phase`` took, its first occurrence left out; None
        before it completed once."""
        key = (phase, detail)
        if not self.completed.get(key):
            return None
        return self.longest.get(key, 0.)


class RankRecord(NamedTuple):
    """What a rank publishes: its progress, the timeout of its phase,
    where it runs.

    Example:
        >>> record = RankRecord(1, 7, 3, 'hook', 'MyHook.after_train_iter',
        ...                     100., 300., 'node3', 42)
        >>> record.where()
        'phase hook (MyHook.after_train_iter) of iteration 7'
        >>> RankRecord.from_text(record.to_text()) == record
        True
    """
    rank: int
    iteration: int
    seq: int
    phase: str
    detail: str
    since: float
    timeout: Optional[float]
    host: str
    pid: int

    def to_text(self) -> str:
        """The record as the store keeps it (JSON)."""
        return json.dumps(list(self))

    @classmethod
    def from_text(cls, text: Union[str, bytes]) -> 'RankRecord':
        """The record a rank wrote with :meth:`to_text`."""
        return cls(*json.loads(text))

    @property
    def position(self) -> Tuple[int, int]:
        """How far the rank got: ``(iteration, seq)``."""
        return self.iteration, self.seq

    def where(self) -> str:
        """``'phase hook (MyHook.after_train_iter) of iteration 7'``."""
        detail = f' ({self.detail})' if self.detail else ''
        step = (f' of iteration {self.iteration}'
                if self.iteration >= 0 else ' before training')
        return f'phase {self.phase}{detail}{step}'


class Stall(NamedTuple):
    """The ranks behind all others and over their timeout, and the ranks
    waiting for them.

    Example:
        >>> stalled = RankRecord(1, 7, 0, 'data', '', 0., 9., 'h', 2)
        >>> Stall([stalled], []).key
        ((1, (7, 0)),)
    """
    stalled: List[RankRecord]
    waiting: List[RankRecord]

    @property
    def key(self) -> Tuple:
        """Same stall, same key: who and where."""
        return tuple((r.rank, r.position) for r in self.stalled)


def find_stall(records: Mapping[int, RankRecord],
               now: float) -> Optional[Stall]:
    """The stall among ``records`` at wall time ``now``, if any.

    The stalled ranks are those behind all others (lowest ``(iteration,
    seq)``) that stayed in their phase longer than their timeout; the
    ranks ahead of them are waiting (in a collective, as a rule), however
    long: a rank that waits is never named. None when no rank behind is
    over its timeout.

    Example:
        >>> def rec(rank, it, seq, t):
        ...     return RankRecord(rank, it, seq, 'data', '', t, 10., 'h', 1)
        >>> records = {0: rec(0, 5, 2, 0.), 1: rec(1, 5, 0, 50.)}
        >>> find_stall(records, now=55.) is None  # rank 1 behind, 5 s
        True
        >>> stall = find_stall(records, now=70.)
        >>> [r.rank for r in stall.stalled], [r.rank for r in stall.waiting]
        ([1], [0])
    """
    if not records:
        return None
    behind = min(r.position for r in records.values())
    stalled = [
        r for r in records.values()
        if r.position == behind and r.timeout is not None and now -
        r.since > r.timeout
    ]
    if not stalled:
        return None
    names = {r.rank for r in stalled}
    waiting = [r for r in records.values() if r.rank not in names]
    return Stall(
        sorted(stalled, key=lambda r: r.rank),
        sorted(waiting, key=lambda r: r.rank))


def dump_path(work_dir: str, rank: int, number: int) -> str:
    """Where rank ``rank`` writes its Python stacks for the run's stall
    ``number``: ``<work_dir>/hangs/rank<rank>-<number>.txt``.

    Example:
        >>> dump_path('work', 3, 1)
        'work/hangs/rank3-1.txt'
    """
    return osp.join(work_dir, 'hangs', f'rank{rank}-{number}.txt')


def _ranks_text(ranks: List[int], most: int = 8) -> str:
    shown = ', '.join(str(r) for r in ranks[:most])
    more = len(ranks) - most
    return shown + (f' (+{more} more)' if more > 0 else '')


def hang_message(stall: Stall, now: float, world_size: int, work_dir: str,
                 number: int, on_hang: str, repeat: float) -> str:
    """The ERROR line about ``stall``: each stalled rank with host,
    phase, iteration, how long and its stack file, how many ranks wait.

    Example:
        >>> stalled = RankRecord(1, 7, 0, 'data', '', 100., 30., 'node3', 42)
        >>> ahead = RankRecord(0, 7, 4, 'backward', '', 130., 30.,
        ...                    'node1', 41)
        >>> print(hang_message(Stall([stalled], [ahead]), 145., 2, 'wd', 1,
        ...                    'warn', 300.))  # doctest: +NORMALIZE_WHITESPACE
        Hang: rank 1 (host node3, pid 42) has been in phase data of \
iteration 7 for 45 s (timeout 30 s), Python stacks in wd/hangs/rank1-1.txt; \
1 of 2 ranks wait for it (rank 0 in phase backward of iteration \
7). on_hang='warn': the run keeps waiting; this line repeats at most every \
300 s.
    """
    parts = []
    for r in stall.stalled[:8]:
        parts.append(f'rank {r.rank} (host {r.host}, pid {r.pid}) has been '
                     f'in {r.where()} for {now - r.since:.0f} s (timeout '
                     f'{r.timeout:.0f} s), Python stacks in '
                     f'{dump_path(work_dir, r.rank, number)}')
    if len(stall.stalled) > 8:
        parts.append(f'{len(stall.stalled) - 8} more ranks in the same '
                     'phase, stacks beside')
    them = 'it' if len(stall.stalled) == 1 else 'them'
    text = 'Hang: ' + '; '.join(parts)
    if stall.waiting:
        first, count = stall.waiting[0], len(stall.waiting)
        who = (f'rank {first.rank}' if count == 1 else
               f'ranks {_ranks_text([r.rank for r in stall.waiting])}; '
               f'rank {first.rank}')
        text += (f'; {count} of {world_size} ranks wait for {them} ({who} '
                 f'in {first.where()})')
    else:
        text += f'; no rank is ahead ({world_size} in all)'
    if on_hang == 'exit':
        return text + (f'. on_hang=\'exit\': every rank exits with status '
                       f'{HANG_EXIT_CODE}; resume from the last checkpoint '
                       '(--resume).')
    return text + (". on_hang='warn': the run keeps waiting; this line "
                   f'repeats at most every {repeat:.0f} s.')
