# Copyright (c) mmstats contributors. All rights reserved.
"""Exact, cheap training statistics across ranks.

``report(name, value)`` records values from anywhere (a loss function, a
module's ``forward``, a hook) without synchronising host and device and
without communicating; ``Collector.update()`` publishes, per name, the
statistics of everything reported since that collector's previous update,
over all ranks::

    collector = Collector(regex='loss.*')
    for batch in loader:
        loss = report('loss', criterion(model(batch)))
        ...
        if step % interval == 0:
            collector.update()          # collective on all ranks
            print(collector.as_dict())  # {'loss': {'num': .., 'mean': ..}}

Published statistics per name: ``num`` (number of finite values),
``mean``, ``std`` (population std, ``ddof=0`` like numpy), ``min``, ``max``
(over the finite values) and ``nonfinite`` (number of NaN / inf values,
kept out of the other statistics so that one NaN does not erase a window).

Values are only kept while at least one :class:`Collector` is alive: with
none, ``report()`` returns at once and records nothing (it does not even
validate ``value``). Values reported before a collector is created never
reach it.

Implementation: ``report()`` appends to global per-name pending storage
(Python numbers to a list; small tensors as float64 copies on their device;
tensors with more than 4096 elements are reduced at once, on their device and
without a sync, to one moments row). Any collector's ``update()`` first
flushes the pending values (one copy to the host per device, then one
grouped numpy reduction over all names) into one row
``[n, mean, M2, min, max, nonfinite]`` (float64) per name and merges that
row into every live collector whose regex matches (Chan et al.'s parallel
merge), then reduces its own accumulators across ranks.

Limitations: values are converted to float64 (integers beyond 2**53 round;
sums beyond 1e308 overflow). Pending memory per name is bounded (at most
256 small tensors, 256 rows and 65536 numbers before compaction). Nested
sequences of tensors go through numpy (a sync for device tensors). Creating
a :class:`Collector` while another is alive flushes the pending values (a
sync). Every rank must create the same collectors, with the same regexes,
in the same order, and call their ``update()`` in the same order.
"""
import math
import numbers
import re
import weakref
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

__all__ = ['report', 'report0', 'Collector', 'phase', 'suspend_reporting']

STAT_NAMES = ('num', 'mean', 'std', 'min', 'max', 'nonfinite')

# A tensor with more elements is reduced to a moments row at report time.
_LARGE_NUMEL = 4096
# Compact a name's pending small tensors / numbers after this many reports.
_MAX_PENDING_TENSORS = 256
_MAX_PENDING_NUMBERS = 65536
_MAX_PENDING_ROWS = 256
_CHUNK_NUMEL = 16384

_INF = float('inf')
_F64 = torch.float64

# Live collectors: id -> weakref. ``report`` returns at once when empty.
_LIVE: Dict[int, 'weakref.ref'] = {}
# Global pending storage, per name, since the last flush.
_NUMS: Dict[str, list] = {}  # Python numbers
_TENSORS: Dict[str, List[torch.Tensor]] = {}  # float64 copies, any shape
_ROWS: Dict[str, List[torch.Tensor]] = {}  # reduced rows, shape (6, )
_EMPTY: set = set()  # names registered without values
_PHASE = ''  # prefix of reported names, e.g. 'val/' during validation
_SUSPENDED = [0]  # > 0 inside ``suspend_reporting()``: report() is a no-op


# --------------------------------------------------------------------------
# Reductions (float64, sync-free, vectorised over groups)
# --------------------------------------------------------------------------
def _empty_rows(num: int, device=None) -> torch.Tensor:
    """Rows of ``num`` groups without values: n=0, min=+inf, max=-inf."""
    rows = torch.zeros(num, 6, dtype=_F64, device=device)
    rows[:, 3] = _INF
    rows[:, 4] = -_INF
    return rows


def _reduce_values(x: torch.Tensor) -> torch.Tensor:
    """Reduce float64 values to one moments row, on their device.

    Corrected two-pass algorithm (no ``E[x^2] - E[x]^2``); non-finite values
    are counted in column 5 and excluded elsewhere. Only sync-free ops
    (``nan_to_num`` instead of boolean masks), so it can run in ``report``.

    Args:
        x (Tensor): 1-d float64 values.

    Returns:
        Tensor: ``(1, 6)`` row ``[n, mean, M2, min, max, nonfinite]``.
    """
    xz = torch.nan_to_num(x, 0., 0., 0.)  # non-finite -> 0
    bad = torch.nan_to_num(x * 0., 1., 1., 1.)  # 1 where non-finite
    nonfinite = bad.sum().reshape(1)
    n = x.numel() - nonfinite
    nc = n.clamp(min=1)
    mean = xz.sum().reshape(1) / nc
    d = torch.nan_to_num(x - mean, 0., 0., 0.)
    mean_fix = d.sum().reshape(1) / nc
    m2 = torch.dot(d, d).reshape(1) - mean_fix * mean_fix * n
    if x.numel():
        mn = torch.nan_to_num(x, _INF, _INF, _INF).amin().reshape(1)
        mx = torch.nan_to_num(x, -_INF, -_INF, -_INF).amax().reshape(1)
    else:
        mn = torch.full((1, ), _INF, dtype=_F64, device=x.device)
        mx = torch.full((1, ), -_INF, dtype=_F64, device=x.device)
    return torch.stack(
        [n, mean + mean_fix,
         m2.clamp(min=0), mn, mx, nonfinite], dim=1)


def _reduce_groups(x: np.ndarray, seg: np.ndarray,
                   groups: int) -> np.ndarray:
    """Reduce host values to one moments row per group (numpy).

    The same corrected two-pass algorithm as :func:`_reduce_values`, grouped
    by ``seg``. Used by ``update()`` for everything pending on the host:
    numpy's ``bincount`` / ``reduceat`` cost a fraction of the torch ops'
    dispatch on small arrays.

    Args:
        x (np.ndarray): 1-d float64 values.
        seg (np.ndarray): 1-d int64 group of each value.
        groups (int): Number of groups.

    Returns:
        np.ndarray: ``(groups, 6)`` rows ``[n, mean, M2, min, max,
        nonfinite]``; groups without values get ``n=0, min=inf, max=-inf``.
    """
    rows = np.zeros((groups, 6))
    rows[:, 3], rows[:, 4] = _INF, -_INF
    if not x.size:
        return rows
    with np.errstate(all='ignore'):
        finite = np.isfinite(x)
        counts = np.bincount(seg, minlength=groups)
        all_finite = bool(finite.all())  # host array: no device sync
        if all_finite:  # common case: no masking needed
            n, low, high = counts.astype(np.float64), x, x
        else:
            n = np.bincount(seg, weights=finite, minlength=groups)
            low, high = np.where(finite, x, _INF), np.where(finite, x, -_INF)
            x = np.where(finite, x, 0.)
        nc = np.maximum(n, 1)
        mean = np.bincount(seg, weights=x, minlength=groups) / nc
        d = x - mean[seg]
        if not all_finite:
            d[~finite] = 0.
        mean_fix = np.bincount(seg, weights=d, minlength=groups) / nc
        m2 = np.bincount(seg, weights=d * d, minlength=groups)
        # min/max per run of equal groups, then per group
        starts = np.flatnonzero(
            np.concatenate(([True], seg[1:] != seg[:-1])))
        np.minimum.at(rows[:, 3], seg[starts],
                      np.minimum.reduceat(low, starts))
        np.maximum.at(rows[:, 4], seg[starts],
                      np.maximum.reduceat(high, starts))
        rows[:, 0] = n
        rows[:, 1] = mean + mean_fix
        rows[:, 2] = np.maximum(m2 - mean_fix * mean_fix * n, 0.)
        rows[:, 5] = counts - n
    return rows


def _merge_rows(rows: torch.Tensor, seg: torch.Tensor,
                groups: int) -> torch.Tensor:
    """Merge moments rows per group (Chan et al.'s parallel formula).

    ``M2 = sum_i M2_i + n_i (mean_i - mean)^2``: exact and stable, min/max
    and counts combine directly. Deterministic: the same rows give the same
    bits on every rank.

    Args:
        rows (Tensor): ``(R, 6)`` float64 rows.
        seg (Tensor): ``(R, )`` int64 group of each row.
        groups (int): number of groups.

    Returns:
        Tensor: ``(groups, 6)`` merged rows.
    """
    dev = rows.device
    zeros = torch.zeros(groups, dtype=_F64, device=dev)
    n_i, mean_i = rows[:, 0], rows[:, 1]
    n = zeros.index_add(0, seg, n_i)
    nc = n.clamp(min=1)
    mean = zeros.index_add(0, seg, n_i * mean_i) / nc
    d = mean_i - mean[seg]
    mean = mean + zeros.index_add(0, seg, n_i * d) / nc
    d = mean_i - mean[seg]
    m2 = zeros.index_add(0, seg, rows[:, 2] + n_i * d * d)
    mn = torch.full((groups, ), _INF, dtype=_F64, device=dev)
    mn = mn.scatter_reduce(0, seg, rows[:, 3], 'amin')
    mx = torch.full((groups, ), -_INF, dtype=_F64, device=dev)
    mx = mx.scatter_reduce(0, seg, rows[:, 4], 'amax')
    nonfinite = zeros.index_add(0, seg, rows[:, 5])
    return torch.stack([n, mean, m2, mn, mx, nonfinite], dim=1)


def _compact_tensors(tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """Reduce pending float64 tensors to moments rows (no sync)."""
    try:  # common case: same shape and device, one op
        flats = [torch.stack(tensors).reshape(-1)]
    except RuntimeError:
        by_dev: Dict[Any, List[torch.Tensor]] = {}
        for t in tensors:
            by_dev.setdefault(t.device, []).append(t.reshape(-1))
        flats = [torch.cat(ts) for ts in by_dev.values()]
    # Chunks of at most _CHUNK_NUMEL elements keep the temporaries small
    # (large ones are fresh, page-faulting allocations on CPU).
    return [
        _reduce_values(flat[i:i + _CHUNK_NUMEL])[0] for flat in flats
        for i in range(0, flat.numel(), _CHUNK_NUMEL)
    ]


def _compact_rows(rows: List[torch.Tensor]) -> List[torch.Tensor]:
    """Merge pending rows to one row per device (no sync)."""
    by_dev: Dict[Any, List[torch.Tensor]] = {}
    for r in rows:
        by_dev.setdefault(r.device, []).append(r)
    out = []
    for rs in by_dev.values():
        stacked = torch.stack(rs)
        seg = torch.zeros(len(rs), dtype=torch.long, device=stacked.device)
        out.append(_merge_rows(stacked, seg, 1)[0])
    return out


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------
def _type_error(name: str, value: Any) -> TypeError:
    return TypeError(
        f'report({name!r}): value must be a number, sequence, numpy array '
        f'or tensor, got {type(value).__name__}')


def _add_row(name: str, row: torch.Tensor) -> None:
    rows = _ROWS.get(name)
    if rows is None:
        _ROWS[name] = [row]
        return
    rows.append(row)
    if len(rows) >= _MAX_PENDING_ROWS:
        _ROWS[name] = _compact_rows(rows)


def _report_tensor(name: str, value: torch.Tensor) -> None:
    numel = value.numel()
    if numel == 0:
        if value.is_complex():
            raise _type_error(name, value)
        _EMPTY.add(name)
        return
    if value.requires_grad:
        value = value.detach()
    dtype = value.dtype
    if numel > _LARGE_NUMEL:
        if value.is_complex():
            raise _type_error(name, value)
        _add_row(name, _reduce_values(value.reshape(-1).to(_F64))[0])
        return
    # A float64 copy: later in-place changes by the caller cannot leak in.
    if dtype is _F64:
        value = value.clone()
    elif dtype.is_complex:
        raise _type_error(name, value)
    else:
        value = value.double()
    tensors = _TENSORS.get(name)
    if tensors is None:
        _TENSORS[name] = [value]
        return
    tensors.append(value)
    if len(tensors) >= _MAX_PENDING_TENSORS:
        del _TENSORS[name]
        for row in _compact_tensors(tensors):
            _add_row(name, row)


def _add_numbers(name: str, values: list) -> None:
    nums = _NUMS.get(name)
    if nums is None:
        _NUMS[name] = nums = []
    nums.extend(values)
    if len(nums) >= _MAX_PENDING_NUMBERS:
        _compact_numbers(name)


def _compact_numbers(name: str) -> None:
    nums = _NUMS.pop(name)
    x = torch.tensor(nums, dtype=_F64)
    _add_row(name, _reduce_values(x)[0])


def _report_slow(name: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        _report_tensor(name, value)
    elif isinstance(value, (str, bytes, dict)) or value is None:
        raise _type_error(name, value)
    elif isinstance(value, (bool, np.bool_)):
        _add_numbers(name, [int(value)])
    elif isinstance(value, numbers.Real):  # np.float32, np.int64, Fraction..
        _add_numbers(name, [float(value)])
    elif isinstance(value, np.ndarray):
        if value.dtype.kind not in 'biuf':
            raise _type_error(name, value)
        if value.size == 0:
            _EMPTY.add(name)
        else:
            # np.array copies: later in-place changes cannot leak in.
            x = torch.from_numpy(np.array(value, dtype=np.float64).ravel())
            _report_tensor(name, x)
    elif isinstance(value, Sequence) or isinstance(value, (set, frozenset)):
        values = list(value)
        if not values:
            _EMPTY.add(name)
        elif all(type(v) in (float, int, bool) for v in values):
            _add_numbers(name, values)
        elif all(isinstance(v, torch.Tensor) for v in values):
            for v in values:
                _report_tensor(name, v)
        else:
            try:
                arr = np.asarray(values, dtype=np.float64)
            except (TypeError, ValueError):
                raise _type_error(name, value) from None
            _report_slow(name, arr)
    else:
        raise _type_error(name, value)


def report(name: str, value: Any) -> Any:
    """Record ``value`` under statistic ``name`` and return it unchanged.

    Callable from anywhere (loss functions, ``nn.Module.forward``, hooks,
    under ``torch.no_grad`` or autograd: tensors are detached). Never
    synchronises host and device and never communicates. Tensors of up to
    4096 elements are copied (as float64); larger ones are reduced at once,
    on their device, to moments; so later in-place changes of ``value`` do
    not change what was recorded. Values are only kept while a
    :class:`Collector` is alive: with none this returns at once.

    Args:
        name (str): Name of the statistic.
        value (float | int | bool | Sequence | np.ndarray | Tensor): Values
            of any shape, dtype and device. An empty value only registers
            the name.

    Returns:
        The same ``value`` object.

    Raises:
        TypeError: ``value`` is not a number, sequence, numpy array or real
            tensor (only checked while a collector is alive).
    """
    if not _LIVE or _SUSPENDED[0]:
        return value
    if _PHASE:
        name = _PHASE + name
    tp = type(value)
    if tp is float or tp is int:
        nums = _NUMS.get(name)
        if nums is None:
            _NUMS[name] = [value]
        else:
            nums.append(value)
            if len(nums) >= _MAX_PENDING_NUMBERS:
                _compact_numbers(name)
        return value
    if tp is torch.Tensor:
        _report_tensor(name, value)
    else:
        _report_slow(name, value)
    return value


def _get_rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def report0(name: str, value: Any) -> Any:
    """Like :func:`report`, but only rank 0's values are counted.

    Other ranks only register ``name`` (so every rank publishes the same
    names) and do not validate ``value``.

    Args:
        name (str): Name of the statistic.
        value (float | int | bool | Sequence | np.ndarray | Tensor): Values.

    Returns:
        The same ``value`` object.
    """
    if not _LIVE or _SUSPENDED[0]:
        return value
    if _get_rank() == 0:
        return report(name, value)
    _EMPTY.add(_PHASE + name)
    return value



def phase(name: Optional[str]) -> Optional[str]:
    """Prefix every name reported from now on with ``'<name>/'``.

    StatsCollectorHook calls ``phase('val')`` while a validation loop runs,
    so that ``report('model/feat_norm', x)`` from a module's ``forward`` is
    recorded as ``val/model/feat_norm`` and kept apart from the training
    values of the same name.

    Args:
        name (str, optional): The phase, e.g. ``'val'`` or ``'test'``; None
            for no prefix (training).

    Returns:
        str or None: The previous phase, to restore it.
    """
    global _PHASE
    previous = _PHASE[:-1] or None
    _PHASE = f'{name}/' if name else ''
    return previous


@contextmanager
def suspend_reporting() -> Iterator[None]:
    """Ignore every :func:`report` / :func:`report0` call inside the block.

    Used by :func:`mmstats.update_bn_stats`, so that values a model reports
    in its forward never reach a collector during a recomputation. Nests.
    """
    _SUSPENDED[0] += 1
    try:
        yield
    finally:
        _SUSPENDED[0] -= 1


# --------------------------------------------------------------------------
# Flush of the global pending storage
# --------------------------------------------------------------------------
def _flush() -> None:
    """Reduce all pending values to one row per name and hand each row to
    every live collector whose regex matches (syncs the devices used)."""
    global _NUMS, _TENSORS, _ROWS, _EMPTY
    nums, tensors, rows, empty = _NUMS, _TENSORS, _ROWS, _EMPTY
    _NUMS, _TENSORS, _ROWS, _EMPTY = {}, {}, {}, set()
    collectors = [
        c for c in (ref() for ref in list(_LIVE.values())) if c is not None
    ]
    if not collectors:
        return
    # sorted: in steady state equal to the collectors' tables (no reorder)
    names = sorted({*nums, *tensors, *rows, *empty})
    if not names:
        return
    index = {name: i for i, name in enumerate(names)}
    # Numbers and small tensors (one copy to the host per device): one
    # grouped numpy reduction over all names.
    values: List[np.ndarray] = []
    segs: List[np.ndarray] = []
    for name, lst in nums.items():
        values.append(np.asarray(lst, dtype=np.float64))
        segs.append(np.full(len(lst), index[name], dtype=np.int64))
    by_dev: Dict[Any, Tuple[list, list, list]] = {}
    for name, ts in tensors.items():
        for t in ts:
            entry = by_dev.setdefault(t.device, ([], [], []))
            entry[0].append(t.reshape(-1))
            entry[1].append(index[name])
            entry[2].append(t.numel())
    for ts, idx, counts in by_dev.values():
        values.append(torch.cat(ts).cpu().numpy())
        segs.append(np.repeat(np.asarray(idx, dtype=np.int64), counts))
    if len(values) == 1:
        x, seg = values[0], segs[0]
    else:
        x = np.concatenate(values) if values else np.zeros(0)
        seg = np.concatenate(segs) if segs else np.zeros(0, np.int64)
    merged = torch.from_numpy(_reduce_groups(x, seg, len(names)))

    # Pre-reduced rows (large tensors, compactions): merge them in.
    flat_rows, flat_idx = [], []
    for name, rs in rows.items():
        for r in rs:
            flat_rows.append(r.to('cpu'))
            flat_idx.append(index[name])
    if flat_rows:
        present = torch.from_numpy(np.unique(seg))
        merged = _merge_rows(
            torch.cat([merged[present], torch.stack(flat_rows)]),
            torch.cat([present, torch.tensor(flat_idx, dtype=torch.long)]),
            len(names))
    for collector in collectors:
        collector._receive(names, merged)


# --------------------------------------------------------------------------
# Collector
# --------------------------------------------------------------------------
def _forget(key: int) -> None:
    _LIVE.pop(key, None)
    if not _LIVE:  # nobody will read them any more
        _NUMS.clear()
        _TENSORS.clear()
        _ROWS.clear()
        _EMPTY.clear()


class Collector:
    """Publish exact statistics of the values reported with :func:`report`.

    Each :meth:`update` publishes, per name matching ``regex`` (with
    :func:`re.fullmatch`), the statistics of every value reported since the
    previous :meth:`update` of this collector on any rank: ``num``,
    ``mean``, ``std`` (``ddof=0``), ``min``, ``max`` over finite values and
    ``nonfinite``, the count of NaN / inf values. Collectors with different
    regexes and update rates are independent and each exact. Accumulation is
    in float64 with two-pass / Chan merges (stable for mean 1e6, std 1).

    Distributed: :meth:`update` is a collective over ``group`` (the default
    process group if None); all ranks must call it. Ranks may report
    different names, in any order, or nothing at all; every rank gets the
    same results, the exact statistics over all ranks' values.

    Protocol and collective count: all ranks keep an identical sorted name
    table. In the steady state (no new names anywhere) :meth:`update` does
    ONE ``all_gather`` of a float64 tensor ``[flag, rows of the table
    names]`` (``1 + 6 * len(table)`` numbers); each rank then merges the
    ``world_size`` rows per name locally with Chan's formula: exact,
    including min/max, and bit-identical on all ranks since all do the same
    arithmetic on the same data. When a rank's flag says it has names not
    in the table, two more collectives follow: one ``all_gather_object`` of
    the new names (table := sorted union) and one ``all_gather`` of their
    rows (3 in all). StyleGAN3's single ``all_reduce`` of ``[n, sum,
    sum_sq]`` cannot give min/max or a stable std, and hangs or mixes
    values silently when ranks' names differ; per-name collectives (Lightning,
    torchmetrics) cost one or more collectives per name.

    Args:
        regex (str): Publish names that fully match this pattern.
            Defaults to '.*'.
        keep_previous (bool): If True, a name with no new values since the
            previous update keeps its previous results; if False it reports
            ``num=0``, ``nonfinite=0`` and NaN statistics. Defaults to True.
        group (ProcessGroup, optional): Process group to reduce over.
            Defaults to None (the default group).
    """

    def __init__(self,
                 regex: str = '.*',
                 keep_previous: bool = True,
                 group: Optional[Any] = None) -> None:
        # Values reported before this collector exists belong to others.
        if _LIVE:
            _flush()
        self._regex = re.compile(regex)
        self._keep_previous = keep_previous
        self._group = group
        self._matches: Dict[str, bool] = {}
        self._chunks: List[Tuple[List[str], torch.Tensor]] = []
        self._table: List[str] = []
        self._results: Dict[str, List[float]] = {}
        key = id(self)
        _LIVE[key] = weakref.ref(self, lambda _, key=key: _forget(key))

    # -- accumulation ------------------------------------------------------
    def _receive(self, names: List[str], rows: torch.Tensor) -> None:
        matches = self._matches
        keep = []
        for i, name in enumerate(names):
            ok = matches.get(name)
            if ok is None:
                ok = matches[name] = self._regex.fullmatch(name) is not None
            if ok:
                keep.append(i)
        if not keep:
            return
        if len(keep) == len(names):
            self._chunks.append((names, rows))
        else:
            self._chunks.append(
                ([names[i]
                  for i in keep], rows[torch.tensor(keep, dtype=torch.long)]))

    def _local_rows(self) -> Tuple[List[str], torch.Tensor]:
        """This rank's names and merged rows since the previous update."""
        chunks, self._chunks = self._chunks, []
        if not chunks:
            return [], _empty_rows(0)
        if len(chunks) == 1:
            names, rows = chunks[0]
        else:
            names = list(dict.fromkeys(n for c in chunks for n in c[0]))
            index = {name: i for i, name in enumerate(names)}
            seg = torch.tensor([index[n] for c in chunks for n in c[0]],
                               dtype=torch.long)
            rows = _merge_rows(torch.cat([c[1] for c in chunks]), seg,
                               len(names))
        return names, rows

    # -- distributed -------------------------------------------------------
    def _world(self) -> Tuple[int, Any]:
        if not (dist.is_available() and dist.is_initialized()):
            return 1, None
        world = dist.get_world_size(self._group)
        device = 'cpu'
        if 'nccl' in str(dist.get_backend(self._group)).lower() and \
                'gloo' not in str(dist.get_backend(self._group)).lower():
            device = torch.device('cuda', torch.cuda.current_device())
        return world, device

    def _gather(self, tensor: torch.Tensor, world: int,
                device: Any) -> torch.Tensor:
        tensor = tensor.to(device)
        out = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(out, tensor, group=self._group)
        return torch.stack(out).cpu()

    @staticmethod
    def _table_rows(table: List[str], names: List[str],
                    rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (one per name of ``names``) in the order of ``table``;
        empty rows for names of ``table`` without values."""
        if names == table:  # steady state: nothing to move
            return rows
        pos = {name: i for i, name in enumerate(names)}
        dst, src = [], []
        for i, name in enumerate(table):
            j = pos.get(name)
            if j is not None:
                dst.append(i)
                src.append(j)
        out = _empty_rows(len(table))
        if dst:  # one indexed copy, not one per name
            out[torch.tensor(dst, dtype=torch.long)] = rows[torch.tensor(
                src, dtype=torch.long)]
        return out

    def update(self) -> None:
        """Publish the statistics of the values reported since the previous
        update (a collective: every rank of the group must call it)."""
        _flush()
        names, local = self._local_rows()
        world, device = self._world()
        table = self._table
        if world == 1:
            new = sorted(set(names) - set(table))
            if new:
                table = self._table = sorted(set(table) | set(new))
            rows = self._table_rows(table, names, local)
        else:
            known = set(table)
            new = [name for name in names if name not in known]
            payload = torch.cat([
                torch.tensor([1. if new else 0.], dtype=_F64),
                self._table_rows(table, names, local).reshape(-1)
            ])
            gathered = self._gather(payload, world, device)
            old_rows = gathered[:, 1:].reshape(world, len(table), 6)
            if bool((gathered[:, 0] != 0).any()):
                lists: List[Any] = [None] * world
                dist.all_gather_object(lists, sorted(new), group=self._group)
                added = sorted(set().union(*map(set, lists)) - known)
                new_rows = self._gather(
                    self._table_rows(added, names, local).reshape(-1), world,
                    device).reshape(world, len(added), 6)
                order = table + added  # columns of old_rows, new_rows
                table = self._table = sorted(known | set(added))
                pos = {name: i for i, name in enumerate(table)}
                perm = torch.tensor([pos[n] for n in order], dtype=torch.long)
                combined = torch.cat([old_rows, new_rows], dim=1)
                rows_all = torch.empty(world, len(table), 6, dtype=_F64)
                rows_all[:, perm] = combined
            else:
                rows_all = old_rows
            seg = torch.arange(len(table)).repeat(world)
            rows = _merge_rows(rows_all.reshape(-1, 6), seg, len(table))
        self._publish(table, rows)

    def _publish(self, table: List[str], rows: torch.Tensor) -> None:
        previous = self._results
        results: Dict[str, List[float]] = {}
        nan = math.nan
        for name, (n, mean, m2, mn, mx,
                   nonfinite) in zip(table, rows.tolist()):
            if n + nonfinite == 0:
                if self._keep_previous and name in previous:
                    results[name] = previous[name]
                else:
                    results[name] = [0., nan, nan, nan, nan, 0.]
            elif n == 0:
                results[name] = [0., nan, nan, nan, nan, nonfinite]
            else:
                results[name] = [n, mean, math.sqrt(m2 / n), mn, mx, nonfinite]
        self._results = results

    # -- accessors ---------------------------------------------------------
    def names(self) -> List[str]:
        """Names published by the last :meth:`update` (sorted)."""
        return list(self._results)

    def _stat(self, name: str, i: int) -> float:
        res = self._results.get(name)
        if res is None:
            return 0. if i in (0, 5) else math.nan
        return res[i]

    def num(self, name: str) -> float:
        """Number of finite values of ``name`` (0 if never published)."""
        return self._stat(name, 0)

    def mean(self, name: str) -> float:
        """Mean of the finite values (NaN if none)."""
        return self._stat(name, 1)

    def std(self, name: str) -> float:
        """Population std (``ddof=0``) of the finite values (NaN if none)."""
        return self._stat(name, 2)

    def min(self, name: str) -> float:
        """Minimum of the finite values (NaN if none)."""
        return self._stat(name, 3)

    def max(self, name: str) -> float:
        """Maximum of the finite values (NaN if none)."""
        return self._stat(name, 4)

    def nonfinite(self, name: str) -> float:
        """Number of NaN / inf values of ``name``."""
        return self._stat(name, 5)

    def as_dict(self) -> Dict[str, Dict[str, float]]:
        """``{name: {'num', 'mean', 'std', 'min', 'max', 'nonfinite'}}``."""
        return {
            name: dict(zip(STAT_NAMES, map(float, res)))
            for name, res in self._results.items()
        }

    def __getitem__(self, name: str) -> float:
        """The mean of ``name``."""
        return self.mean(name)
