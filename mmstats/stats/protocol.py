# Copyright (c) mmstats contributors. All rights reserved.
"""The cross-rank part of :class:`~mmstats.stats.Collector`.

All ranks keep the same sorted name table. In steady state (no new names
anywhere) one update is three collectives whose size per rank depends on
the table only, never on the world size:

1. ``all_reduce MAX`` of ``[error, new_names, max_i..., -min_i...]``;
2. ``all_reduce SUM`` of ``[n_i, n_i (mean_i - ref), nonfinite_i]`` per name,
   ``ref`` the midpoint of the reduced finite range (known to all ranks);
3. ``all_reduce SUM`` of ``[M2_i + n_i d_i^2, n_i d_i]``, ``d_i = mean_i -
   mean``: Chan's merge, exact once the global mean is known, plus a
   correction of that mean.

When some rank has new names, the ranks agree on their sorted union
(``all_gather_object`` of the new names only) and redo step 1 for the new
table.

Small groups (at most ``GATHER_MAX_WORLD`` ranks, and a ``ReduceFns`` with
``all_gather``) take ONE collective instead: an ``all_gather`` of
``[header, rows]``, merged on every rank in rank order (Chan's pairwise
formula, identical bits everywhere); a sketching collector adds one SUM of
its block, sized by the gathered extremes. There a collective's latency
costs more than its payload, which grows with the world size (``W - 1``
rows in per name). See ``docs/stats.md`` for the rationale and the costs.
"""
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine import dist

from .moments import M2, MAX, MEAN, MIN, NONFINITE, ROW_WIDTH, N

__all__ = ['ReduceFns', 'NameTable', 'RankFailure', 'reduce_moments']

# Columns of the header that leads the first (MAX) collective.
HEADER_ERROR, HEADER_NEW = 0, 1
HEADER_WIDTH = 2
# How many refused names a warning shows.
SHOWN_NAMES = 5
# Up to this many ranks, one all_gather replaces the all_reduces.
GATHER_MAX_WORLD = 4


class ReduceFns:
    """The collectives of the protocol, on host float64 arrays, through
    :mod:`mmengine.dist` (which moves them to the backend's device).

    Injectable: tests pass an object with the same methods that simulates
    several ranks in one process. Every method is a collective when the
    group has more than one rank (a no-op otherwise).

    Args:
        group (ProcessGroup, optional): Process group. Defaults to None
            (the default group).

    Example:
        >>> import numpy as np
        >>> fns = ReduceFns()  # one process: every call returns its input
        >>> fns.all_reduce_sum(np.array([1., 2.])).tolist()
        [1.0, 2.0]
        >>> fns.all_gather(np.array([3.])).tolist()
        [[3.0]]
    """

    def __init__(self, group: Optional[Any] = None) -> None:
        self.group = group

    @property
    def world_size(self) -> int:
        """The number of ranks in the group."""
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return dist.get_rank(self.group)

    def all_reduce_sum(self, x: np.ndarray) -> np.ndarray:
        """Elementwise sum over ranks (identical bits on every rank)."""
        tensor = torch.from_numpy(x)
        dist.all_reduce(tensor, 'sum', self.group)
        return tensor.numpy()

    def all_reduce_max(self, x: np.ndarray) -> np.ndarray:
        """Elementwise maximum over ranks."""
        tensor = torch.from_numpy(x)
        dist.all_reduce(tensor, 'max', self.group)
        return tensor.numpy()

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        """Every rank's 1-d ``x`` (the same length on every rank), stacked
        in rank order: ``(world_size, len(x))``."""
        gathered = dist.all_gather(torch.from_numpy(x), self.group)
        return torch.stack(gathered).cpu().numpy()

    def all_gather_object(self, obj: Any) -> List[Any]:
        """Every rank's ``obj``, indexed by rank."""
        return dist.all_gather_object(obj, self.group)


class RankFailure(RuntimeError):
    """Raised on every rank when :meth:`NameTable.sync` saw a failure.

    Example:
        >>> import numpy as np
        >>> table = NameTable(max_names=8, evict_after=2)
        >>> table.sync(['x'], np.zeros((1, 6)), ReduceFns(), failed=True)
        Traceback (most recent call last):
        ...
        mmstats.stats.protocol.RankFailure: Collector.update() failed on rank 0
    """


def sum_blocks(fns: ReduceFns,
               blocks: Sequence[np.ndarray]) -> List[np.ndarray]:
    """All-reduce SUM several arrays in ONE collective, split them back.

    The place where more per-name payloads (e.g. fixed-size sketch bucket
    counts) join the moments' first SUM.

    Example:
        >>> import numpy as np
        >>> first, second = sum_blocks(ReduceFns(),
        ...                            [np.ones(2), np.zeros((1, 3))])
        >>> first.tolist(), second.shape  # one process: sums of one rank
        ([1.0, 1.0], (1, 3))
    """
    flat = fns.all_reduce_sum(
        np.concatenate([np.asarray(b, np.float64).ravel() for b in blocks]))
    out, start = [], 0
    for block in blocks:
        out.append(flat[start:start + block.size].reshape(block.shape))
        start += block.size
    return out


def reduce_moments(local: np.ndarray,
                   low: np.ndarray,
                   high: np.ndarray,
                   fns: ReduceFns,
                   extra: Optional[np.ndarray] = None
                   ) -> Tuple[np.ndarray, ...]:
    """Merge each rank's rows of the same table into global rows.

    Two all_reduce SUM of fixed size per name. Sums are taken around a
    shared reference (the midpoint of the global finite range), so
    ``n_i * mean_i`` never sums large, nearly equal numbers.

    Args:
        local (np.ndarray): ``(T, ROW_WIDTH)`` this rank's rows.
        low (np.ndarray): ``(T, )`` global minimum (inf if no finite value).
        high (np.ndarray): ``(T, )`` global maximum (-inf if none).
        fns (ReduceFns): The collectives.
        extra (np.ndarray, optional): A float64 block summed over ranks in
            the first SUM (e.g. sketch bucket counts). Defaults to None.

    Returns:
        tuple[np.ndarray, np.ndarray | None]: ``(T, ROW_WIDTH)`` global
        rows, identical on all ranks, and the summed ``extra``.

    Example:
        >>> import numpy as np
        >>> local = np.array([[2., 3., 2., 2., 4., 0.]])  # the row of [2, 4]
        >>> rows, extra = reduce_moments(local, local[:, 3], local[:, 4],
        ...                              ReduceFns(), extra=np.ones(2))
        >>> rows.tolist(), extra.tolist()  # one process: its own rows
        ([[2.0, 3.0, 2.0, 2.0, 4.0, 0.0]], [1.0, 1.0])
    """
    n_i, mean_i = local[:, N], local[:, MEAN]
    has_finite = high >= low
    ref = 0.5 * np.where(has_finite, low, 0.) + 0.5 * np.where(
        has_finite, high, 0.)
    blocks = [np.stack([n_i, n_i * (mean_i - ref), local[:, NONFINITE]])]
    if extra is not None:
        blocks.append(extra)
    summed = sum_blocks(fns, blocks)
    n, shifted, nonfinite = summed[0]
    n_safe = np.maximum(n, 1.)
    mean = ref + shifted / n_safe
    dev = np.where(n_i > 0, mean_i - mean, 0.)
    m2_sum, dev_sum = sum_blocks(
        fns, [np.stack([local[:, M2] + n_i * dev * dev, n_i * dev])])[0]
    fix = dev_sum / n_safe
    rows = np.empty((len(n), ROW_WIDTH))
    rows[:, N], rows[:, NONFINITE] = n, nonfinite
    rows[:, MEAN] = mean + fix
    rows[:, M2] = np.maximum(m2_sum - n * fix * fix, 0.)
    rows[:, MIN], rows[:, MAX] = low, high
    return rows, (summed[1] if extra is not None else None)


def merge_gathered(gathered: np.ndarray) -> np.ndarray:
    """Merge every rank's rows of the same table, in rank order.

    Args:
        gathered (np.ndarray): ``(W, T, ROW_WIDTH)`` rows of each rank.

    Returns:
        np.ndarray: ``(T, ROW_WIDTH)`` global rows (Chan et al.'s pairwise
        merge, exact and the same bits on every rank).

    Example:
        >>> import numpy as np
        >>> gathered = np.array([[[2., 3., 2., 2., 4., 0.]],  # rank 0: [2, 4]
        ...                      [[1., 6., 0., 6., 6., 0.]]])  # rank 1: [6]
        >>> merge_gathered(gathered).tolist()  # the row of [2, 4, 6]
        [[3.0, 4.0, 8.0, 2.0, 6.0, 0.0]]
    """
    out = gathered[0].copy()
    for rows in gathered[1:]:
        n_a, n_b = out[:, N], rows[:, N]
        n = n_a + n_b
        n_safe = np.maximum(n, 1.)
        delta = np.where(n_b > 0, rows[:, MEAN] - out[:, MEAN], 0.)
        out[:, MEAN] = np.where(n_a > 0, out[:, MEAN] + delta * n_b / n_safe,
                                rows[:, MEAN])
        out[:, M2] += rows[:, M2] + delta * delta * (n_a * n_b / n_safe)
        out[:, N] = n
        out[:, NONFINITE] += rows[:, NONFINITE]
        np.minimum(out[:, MIN], rows[:, MIN], out=out[:, MIN])
        np.maximum(out[:, MAX], rows[:, MAX], out=out[:, MAX])
    return out


class NameTable:
    """The name table all ranks agree on, bounded, with idle eviction.

    Args:
        max_names (int): At most this many names; further new names are
            refused (sorted order decides) with a warning.
        evict_after (int): A name without any value on any rank for this
            many consecutive updates leaves the table.
        owner (str): Who warns (for messages). Defaults to 'Collector'.

    Example:
        >>> import numpy as np
        >>> table, fns = NameTable(max_names=8, evict_after=2), ReduceFns()
        >>> row = np.array([[2., 3., 2., 2., 4., 0.]])  # the row of [2, 4]
        >>> table.sync(['loss'], row, fns)[0]
        ['loss']
        >>> table.sync([], np.zeros((0, 6)), fns)[0]  # idle once: kept
        ['loss']
        >>> table.sync([], np.zeros((0, 6)), fns)[0]  # twice: evicted
        []
    """

    def __init__(self,
                 max_names: int,
                 evict_after: int,
                 owner: str = 'Collector') -> None:
        self.max_names = max_names
        self.evict_after = evict_after
        self.owner = owner
        self.names: List[str] = []
        self._index: Dict[str, int] = {}
        self._idle = np.zeros(0, np.int64)  # updates without values

    def _set_names(self, names: List[str], idle: List[int]) -> None:
        self.names = names
        self._index = {name: i for i, name in enumerate(names)}
        self._idle = np.array(idle, np.int64)

    @staticmethod
    def _align(table: List[str], names: List[str],
               rows: np.ndarray) -> np.ndarray:
        """``rows`` (one per ``names``) in ``table`` order, empty rows for
        the table's names without values, names outside it dropped."""
        if names == table:  # steady state: nothing to move
            return rows
        out = np.zeros((len(table), ROW_WIDTH))
        out[:, MIN], out[:, MAX] = np.inf, -np.inf
        index = {name: i for i, name in enumerate(table)}
        pairs = [(index[n], i) for i, n in enumerate(names) if n in index]
        if pairs:
            dst, src = np.array(pairs).T
            out[dst] = rows[src]
        return out

    @staticmethod
    def _extremes(fns: ReduceFns, head: np.ndarray,
                  local: np.ndarray) -> Tuple[np.ndarray, ...]:
        """One all_reduce MAX: ``head``, global min and max per row."""
        size = len(local)
        reduced = fns.all_reduce_max(
            np.concatenate([head, local[:, MAX], -local[:, MIN]]))
        rest = reduced[len(head):]
        return reduced[:len(head)], -rest[size:], rest[:size]

    def _warn_refused(self, refused: List[str]) -> None:
        shown = ', '.join(map(repr, refused[:SHOWN_NAMES]))
        more = len(refused) - SHOWN_NAMES
        warnings.warn(
            f'{self.owner}: {len(refused)} new names refused because the '
            f'table is full (max_names={self.max_names}): {shown}'
            f'{f" and {more} more" if more > 0 else ""}. Names leave the '
            f'table after evict_after={self.evict_after} updates without '
            'values; raise max_names to keep more.',
            stacklevel=4)

    def _admit(self, names: List[str], rows: np.ndarray,
               fns: ReduceFns) -> Tuple[np.ndarray, ...]:
        """Agree on the new names, make room, admit within ``max_names``.

        Two collectives: the new names, then one MAX over the old table's
        "has a value now" flags and the extremes of old and new names.
        Names that the end of this update would evict leave first.
        """
        old = self.names
        new = sorted(n for n in names if n not in self._index)
        gathered = fns.all_gather_object(new)
        union = sorted(set().union(*map(set, gathered)) - set(old))
        candidates = old + union
        local = self._align(candidates, names, rows)
        active_now = local[:len(old), N] + local[:len(old), NONFINITE] > 0
        active, low, high = self._extremes(fns, active_now.astype(float),
                                           local)
        leaving = (active == 0) & (self._idle + 1 >= self.evict_after)
        kept = [n for n, out in zip(old, leaving.tolist()) if not out]
        room = max(self.max_names - len(kept), 0)
        if len(union) > room:
            self._warn_refused(union[room:])
        idle = dict(zip(old, self._idle.tolist()))
        table = sorted(kept + union[:room])
        self._set_names(table, [idle.get(n, 0) for n in table])
        pos = {name: i for i, name in enumerate(candidates)}
        take = np.array([pos[n] for n in self.names], np.int64)
        return local[take], low[take], high[take]

    def sync(self,
             names: List[str],
             rows: np.ndarray,
             fns: ReduceFns,
             failed: bool = False) -> Tuple[List[str], np.ndarray]:
        """Reduce this rank's rows with every rank's (a collective).

        Args:
            names (list[str]): This rank's names.
            rows (np.ndarray): ``(len(names), ROW_WIDTH)`` their rows.
            fns (ReduceFns): The collectives.
            failed (bool): This rank failed before syncing; every rank
                raises. Defaults to False.

        Returns:
            tuple[list[str], np.ndarray]: The published names (the table
            after eviction) and their global rows.

        Raises:
            RankFailure: On every rank if some rank ``failed``.
        """
        return self.sync_with(names, rows, fns, failed)[:2]

    def sync_with(
        self,
        names: List[str],
        rows: np.ndarray,
        fns: ReduceFns,
        failed: bool = False,
        extra: Optional[Callable[..., np.ndarray]] = None
    ) -> Tuple[List[str], np.ndarray, Optional[np.ndarray]]:
        """:meth:`sync`, plus a block summed in the same SUM.

        Args:
            extra (Callable, optional): Called with the agreed table and its
                global finite minima and maxima (``extra(table, low,
                high)``), returns this rank's float64 block (of the same
                shape on every rank). Defaults to None.

        Returns:
            tuple: The names, their rows and the summed ``extra`` block, for
            the table ``extra`` was called with (names evicted by this
            update are in it; None without ``extra``).
        """
        has_new = any(name not in self._index for name in names)
        header = np.array([fns.rank + 1. if failed else 0., float(has_new)])
        local = self._align(self.names, names, rows)
        if (getattr(fns, 'all_gather', None) is not None
                and fns.world_size <= GATHER_MAX_WORLD):
            return self._sync_gathered(header, local, names, rows, fns, extra)
        head, low, high = self._extremes(fns, header, local)
        if head[HEADER_ERROR]:
            raise RankFailure(f'{self.owner}.update() failed on rank '
                              f'{int(head[HEADER_ERROR]) - 1}')
        if head[HEADER_NEW]:
            local, low, high = self._admit(names, rows, fns)
        if not self.names:
            return [], np.zeros((0, ROW_WIDTH)), None
        block = None if extra is None else extra(self.names, low, high)
        merged, summed = reduce_moments(local, low, high, fns, block)
        return self._evict(merged, summed)

    def _sync_gathered(self, header: np.ndarray, local: np.ndarray,
                       names: List[str], rows: np.ndarray, fns: ReduceFns,
                       extra: Optional[Callable[..., np.ndarray]]) -> tuple:
        """:meth:`sync_with` for small groups: one ``all_gather`` of
        ``[header, rows]`` in steady state (a table that changes costs the
        name agreement and a second gather), plus one SUM of the ``extra``
        block, which is sized by the gathered extremes."""
        head, merged = self._gather(fns, header, local)
        if head[HEADER_ERROR]:
            raise RankFailure(f'{self.owner}.update() failed on rank '
                              f'{int(head[HEADER_ERROR]) - 1}')
        if head[HEADER_NEW]:
            local = self._admit(names, rows, fns)[0]
            merged = self._gather(fns, np.zeros(HEADER_WIDTH), local)[1]
        if not self.names:
            return [], np.zeros((0, ROW_WIDTH)), None
        summed = None
        if extra is not None:  # sized by the global extremes: one more SUM
            block = np.asarray(
                extra(self.names, merged[:, MIN], merged[:, MAX]), np.float64)
            summed = fns.all_reduce_sum(block.ravel()).reshape(block.shape)
        return self._evict(merged, summed)

    def _gather(self, fns: ReduceFns, header: np.ndarray,
                local: np.ndarray) -> tuple:
        """One all_gather: the max header and the merged rows (in rank
        order: the same bits on every rank)."""
        size = len(self.names)
        gathered = fns.all_gather(np.concatenate([header, local.ravel()]))
        head = gathered[:, :HEADER_WIDTH].max(0)
        body = gathered[:, HEADER_WIDTH:HEADER_WIDTH + size * ROW_WIDTH]
        merged = merge_gathered(body.reshape(len(body), size, ROW_WIDTH))
        return head, merged

    def _evict(self, merged: np.ndarray,
               summed: Optional[np.ndarray]) -> Tuple[Any, ...]:
        """Count idle updates; drop names idle for ``evict_after``."""
        active = merged[:, N] + merged[:, NONFINITE] > 0
        self._idle = np.where(active, 0, self._idle + 1)
        keep = self._idle < self.evict_after
        if keep.all():
            return self.names, merged, summed
        self._set_names([n for n, k in zip(self.names, keep.tolist()) if k],
                        self._idle[keep])
        return self.names, merged[keep], summed
