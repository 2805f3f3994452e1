# Copyright (c) mmstats contributors. All rights reserved.
"""Collector: exact statistics over all ranks of what :func:`report` got."""
import math
from typing import Any, Dict, List, Optional, Pattern, Sequence, Tuple, Union

import numpy as np
import torch

from mmstats.utils.args import check_bool, check_positive_int, compile_regex
from .moments import M2, MAX, MEAN, MIN, NONFINITE, N, empty_rows, merge_rows
from .pending import Flush
from .protocol import NameTable, RankFailure, ReduceFns
from .reporting import REPORTER
from .sketch import Sketch, clamped_quantiles
from .sketch_sum import SketchSum

__all__ = ['Collector', 'STAT_NAMES']

STAT_NAMES = ('num', 'mean', 'std', 'min', 'max', 'nonfinite')
MIN_AT, MAX_AT = STAT_NAMES.index('min'), STAT_NAMES.index('max')
NONFINITE_AT = STAT_NAMES.index('nonfinite')
# Defaults of the name table's bounds (see docs/stats.md).
MAX_NAMES = 4096
EVICT_AFTER = 100
# Pending chunks a collector holds before it merges them into one: a
# collector updated less often than others holds one row per name.
MAX_CHUNKS = 2


class Collector:
    """Publish exact statistics of the values reported with :func:`report`.

    Each :meth:`update` publishes, per name matching ``regex``
    (:func:`re.fullmatch`), the statistics of every value reported since
    this collector's previous :meth:`update` on any rank: ``num``, ``mean``,
    ``std`` (``ddof=0``), ``min``, ``max`` over finite values and
    ``nonfinite``, the count of NaN / inf values. Collectors are independent
    and each exact; accumulation is in float64 (stable for mean 1e6, std 1).

    :meth:`update` is a collective over ``group``: all ranks must call it.
    Ranks may report different names, in any order, or nothing at all;
    every rank gets the same results. See ``docs/stats.md`` for the
    protocol.

    Args:
        regex (str | re.Pattern): Publish names that fully match this
            pattern (inline flags such as ``(?i)`` work). Defaults to '.*'.
        keep_previous (bool): If True, a name with no new values since the
            previous update keeps its previous results (but ``nonfinite``,
            a count of this update's values, is 0); if False it reports
            ``num=0``, ``nonfinite=0`` and NaN statistics. Defaults to True.
        group (ProcessGroup, optional): Process group to reduce over.
            Defaults to None (the default group).
        max_names (int): At most this many names in the table; further new
            names are refused (the first in sorted order are admitted) with
            a warning per update. Defaults to 4096.
        evict_after (int): A name that got no value on any rank for this
            many consecutive updates leaves the table and is no longer
            published. Defaults to 100.
        reduce_fns (ReduceFns, optional): The collectives (tests inject
            fakes). Defaults to None: ``torch.distributed`` on ``group``.
        sketch (bool): Also keep a mergeable quantile sketch per name, for
            :meth:`quantile` (within 1% relative of a true value, any
            float64 magnitude; sparse: memory per name grows with the
            buckets seen; merged in the same collective as the moments).
            See ``docs/quantiles.md``.
            Defaults to False.

    Example:
        >>> from mmstats import Collector, report
        >>> collector = Collector(regex='loss.*')
        >>> for loss in (0.5, 1.5, 1.0):
        ...     _ = report('loss', loss)
        >>> _ = report('acc', 0.9)  # not matched: not published here
        >>> collector.update()  # a collective: every rank calls it
        >>> collector.as_dict()['loss']['mean'], collector.names()
        (1.0, ['loss'])
    """

    def __init__(self,
                 regex: Union[str, Pattern] = '.*',
                 keep_previous: bool = True,
                 group: Optional[Any] = None,
                 max_names: int = MAX_NAMES,
                 evict_after: int = EVICT_AFTER,
                 reduce_fns: Optional[ReduceFns] = None,
                 sketch: bool = False) -> None:
        compiled = compile_regex('Collector', 'regex', regex, pattern_ok=True)
        check_bool(
            'Collector',
            'sketch',
            sketch,
            meaning='True keeps '
            'quantile sketches')
        check_bool('Collector', 'keep_previous', keep_previous)
        max_names = check_positive_int('Collector', 'max_names', max_names,
                                       MAX_NAMES)
        evict_after = check_positive_int('Collector', 'evict_after',
                                         evict_after, EVICT_AFTER)
        self._regex = compiled
        self._keep_previous = keep_previous
        self._group = group
        self._matches: Dict[str, bool] = {}
        self._chunks: List[Tuple[List[str], torch.Tensor]] = []
        self._fns = ReduceFns(group) if reduce_fns is None else reduce_fns
        self._table = NameTable(max_names, evict_after)
        self._results: Dict[str, List[float]] = {}
        self._sketch = sketch
        self._counts: Dict[str, np.ndarray] = {}  # pending, this rank
        self._sketches: Dict[str, Sketch] = {}  # published, merged
        self._new: Dict[str, bool] = {}  # published: got values now
        # this rank's names and rows of the last update (largest_ranks,
        # local_nonfinite)
        self._last: Tuple[List[str], Optional[np.ndarray]] = ([], None)
        if REPORTER.live_collectors():  # what is pending is theirs
            _deliver()
        REPORTER.register(self, sketch)

    # -- accumulation ------------------------------------------------------
    def receive(self, flushed: Flush) -> None:
        """Keep the rows (and sketch counts) of the names this collector
        publishes from a flush of the pending values (every live
        collector gets each flush).

        Args:
            flushed (Flush): Names, moment rows and sketch counts.
        """
        names, rows, counts = flushed
        matches = self._matches
        keep = []
        for i, name in enumerate(names):
            ok = matches.get(name)
            if ok is None:
                ok = matches[name] = self._regex.fullmatch(name) is not None
            if ok:
                keep.append(i)
        if len(matches) > 4 * self._table.max_names:  # bounded cache
            matches.clear()
        if not keep:
            return
        if self._sketch and counts is not None:
            for i in keep:
                mine = self._counts.get(names[i])
                if mine is None:
                    self._counts[names[i]] = counts[i].copy()
                else:
                    mine += counts[i]
        if len(keep) == len(names):
            self._chunks.append((names, rows))
        else:
            self._chunks.append(
                ([names[i]
                  for i in keep], rows[torch.tensor(keep, dtype=torch.long)]))
        if len(self._chunks) >= MAX_CHUNKS:  # not updated: stay bounded
            self._chunks = [self._local_rows()]

    def _local_rows(self) -> Tuple[List[str], torch.Tensor]:
        """This rank's names and merged rows since the previous update."""
        chunks, self._chunks = self._chunks, []
        if not chunks:
            return [], empty_rows(0)
        if len(chunks) == 1:
            return chunks[0]
        names = list(dict.fromkeys(n for c in chunks for n in c[0]))
        index = {name: i for i, name in enumerate(names)}
        seg = torch.tensor([index[n] for c in chunks for n in c[0]],
                           dtype=torch.long)
        rows = merge_rows(torch.cat([c[1] for c in chunks]), seg, len(names))
        return names, rows

    # -- publication -------------------------------------------------------
    def update(self) -> None:
        """Publish the statistics of the values reported since the previous
        update (a collective: every rank of the group must call it).

        Raises:
            RuntimeError: On every rank, if reducing the pending values
                failed on some rank; values of this rank are kept for the
                next update.
        """
        failure: Optional[BaseException] = None
        try:
            _deliver()
        except Exception as e:  # every rank must still take part
            failure = e
        names, local = self._local_rows()
        extra = SketchSum(self._counts) if self._sketch else None
        try:
            table, rows, summed = self._table.sync_with(
                names, local.numpy(), self._fns, failure is not None, extra)
        except RankFailure as e:
            if names:  # nothing pending is lost: publish it next time
                self._chunks.insert(0, (names, local))
            raise RuntimeError(
                f'{e}; no statistics were published, the values '
                'pending on the other ranks are kept') from failure
        self._counts = {}
        self._last = (names, local.numpy())
        self._publish(table, rows,
                      None if extra is None else extra.unpack(summed, table))

    def _publish(self,
                 table: List[str],
                 rows: np.ndarray,
                 counts: Optional[List[Sketch]] = None) -> None:
        """Keep the published statistics of ``table`` (computed for all
        names at once; a loop only over names without values that keep
        their previous statistics)."""
        n, nonfinite = rows[:, N], rows[:, NONFINITE]
        has = n > 0
        self._new = dict(zip(table, (n + nonfinite > 0).tolist()))
        out = np.full((len(table), len(STAT_NAMES)), math.nan)
        out[:, 0] = n
        out[:, NONFINITE_AT] = nonfinite
        out[has, 1] = rows[has, MEAN]
        out[has, 2] = np.sqrt(rows[has, M2] / n[has])
        out[has, MIN_AT] = rows[has, MIN]
        out[has, MAX_AT] = rows[has, MAX]
        results: Dict[str, List[float]] = dict(zip(table, out.tolist()))
        sketches: Dict[str, Sketch] = ({} if counts is None else dict(
            zip(table, counts)))
        if self._keep_previous:
            previous = self._results
            for i in np.flatnonzero(n + nonfinite == 0).tolist():
                name = table[i]
                if name in previous:
                    # the statistics stay; the non-finite count is of now
                    results[name] = previous[name][:NONFINITE_AT] + [0.]
                    if name in self._sketches:
                        sketches[name] = self._sketches[name]
        self._results = results
        self._sketches = sketches

    # -- accessors ---------------------------------------------------------
    def names(self) -> List[str]:
        """Names published by the last :meth:`update` (sorted)."""
        return list(self._results)

    def _stat(self, name: str, stat: str) -> float:
        i = STAT_NAMES.index(stat)
        res = self._results.get(name)
        if res is None:
            return 0. if stat in ('num', 'nonfinite') else math.nan
        return res[i]

    def num(self, name: str) -> float:
        """Number of finite values of ``name`` (0 if never published)."""
        return self._stat(name, 'num')

    def mean(self, name: str) -> float:
        """Mean of the finite values (NaN if none)."""
        return self._stat(name, 'mean')

    def std(self, name: str) -> float:
        """Population std (``ddof=0``) of the finite values (NaN if none)."""
        return self._stat(name, 'std')

    def min(self, name: str) -> float:
        """Minimum of the finite values (NaN if none)."""
        return self._stat(name, 'min')

    def max(self, name: str) -> float:
        """Maximum of the finite values (NaN if none)."""
        return self._stat(name, 'max')

    def nonfinite(self, name: str) -> float:
        """Number of NaN / inf values of ``name``."""
        return self._stat(name, 'nonfinite')

    def local_nonfinite(self) -> Dict[str, int]:
        """This rank's own NaN / inf counts in the values of the last
        :meth:`update` (names without any left out); no collective.

        Example:
            >>> from mmstats import report
            >>> collector = Collector('x')
            >>> _ = report('x', [1.0, float('nan')])
            >>> collector.update()
            >>> collector.local_nonfinite()
            {'x': 1}
        """
        names, rows = self._last
        if rows is None:
            return {}
        counts = rows[:, NONFINITE]
        return {
            names[i]: int(counts[i])
            for i in np.flatnonzero(counts).tolist()
        }

    def quantile(self, name: str,
                 q: Union[float,
                          Sequence[float]]) -> Union[float, List[float]]:
        """Quantile(s) ``q`` of the finite values of ``name`` (numpy's
        ``method='lower'``, within 1% relative), from its merged sketch,
        clamped into the exact ``[min, max]`` (exact for q = 0 and 1).

        Args:
            name (str): The name.
            q (float | Sequence[float]): Quantile(s) in ``[0, 1]``.

        Returns:
            float | list[float]: One value per ``q``; NaN where ``name`` has
            no finite value or was not published.

        Raises:
            ValueError: If the collector was created without ``sketch=True``
                or a ``q`` is outside ``[0, 1]``.
        """
        if not self._sketch:
            raise ValueError('Collector.quantile needs a sketch: create the '
                             'collector with Collector(..., sketch=True)')
        qs = np.asarray(q, dtype=np.float64)
        if not ((qs >= 0) & (qs <= 1)).all():
            raise ValueError(f'Collector.quantile: q must be in [0, 1], got '
                             f'{q!r}')
        res, counts = self._results.get(name), self._sketches.get(name)
        if res is None or counts is None or res[0] == 0:
            out = np.full(qs.shape, math.nan)
        else:
            out = clamped_quantiles(counts, qs, res[MIN_AT], res[MAX_AT])
        return float(out) if out.ndim == 0 else out.tolist()

    def sketch(self, name: str) -> Optional[Sketch]:
        """The merged (all-rank) quantile sketch of ``name`` published by
        the last :meth:`update` (None without ``sketch=True`` or for a name
        not published); see :mod:`mmstats.health.histograms`."""
        return self._sketches.get(name)

    def is_new(self, name: str) -> bool:
        """Whether ``name`` got values (finite or not) on some rank since
        the previous update: False where ``keep_previous`` re-published
        its previous statistics, or it was not published."""
        return self._new.get(name, False)

    def largest_ranks(self, names: Sequence[str]) -> Dict[str, int]:
        """The rank that reported the published ``max`` of each name, the
        lowest such rank on a tie (the same on every rank).

        A collective (every rank calls it with the same ``names``, after
        the same :meth:`update`): one ``all_reduce MAX`` of ``len(names)``
        values; none on one process. A rank holds a name's maximum when
        its own maximum since the previous update equals it (exact: the
        published maximum is the largest of the ranks' own).

        Args:
            names (Sequence[str]): Names with new finite values in the
                last update.

        Returns:
            dict[str, int]: The rank per name; -1 where no rank holds it
            (a name without new finite values).
        """
        world, rank = self._fns.world_size, self._fns.rank
        mine, rows = self._last
        local = {} if rows is None else dict(zip(mine, rows[:, MAX]))
        # world - 1 - rank: MAX picks the lowest rank holding the maximum
        flags = np.array([
            float(world - 1 - rank)
            if local.get(name, -math.inf) == self.max(name) else -1.
            for name in names
        ])
        if world > 1 and len(flags):
            flags = self._fns.all_reduce_max(flags)
        return {
            name: int(world - 1 - flag) if flag >= 0 else -1
            for name, flag in zip(names, flags.tolist())
        }

    def sketch_bytes(self) -> int:
        """Bytes held by the published quantile sketches (0 without
        ``sketch=True``): what quantiles cost in memory, per update."""
        return sum(sketch.nbytes for sketch in self._sketches.values())

    def as_dict(self) -> Dict[str, Dict[str, float]]:
        """``{name: {'num', 'mean', 'std', 'min', 'max', 'nonfinite'}}``."""
        stat_names = STAT_NAMES
        return {
            name: dict(zip(stat_names, res))
            for name, res in self._results.items()
        }

    def __getitem__(self, name: str) -> float:
        """The mean of ``name``."""
        return self.mean(name)


def _deliver() -> None:
    """Reduce everything pending once and hand it to every live collector
    (each keeps the names its regex matches)."""
    flushed, collectors = REPORTER.flush()
    if flushed.names:
        for collector in collectors:
            collector.receive(flushed)
