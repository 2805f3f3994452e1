# Copyright (c) mmstats contributors. All rights reserved.
"""Values reported and not yet published, in one room: the checks a value
passes at ``report()``, a :class:`PendingStore` per reporting thread (merged
by the main thread's :class:`RootStore` at a flush) and the
:class:`PendingSketches` counts they share. Plain classes, no module
state: :class:`~mmstats.stats.reporting.Reporter` builds one
``PendingSketches`` and one ``RootStore`` over it, and one
``PendingStore`` per other thread (``docs/reporting.md``).

Example:
    >>> from mmstats.stats.pending import PendingSketches, RootStore
    >>> store = RootStore(PendingSketches())
    >>> store.add('loss', 0.5)
    >>> store.add('loss', [1.5, 1.0])
    >>> flushed = store.flush()
    >>> flushed.names, flushed.rows[0, :2].tolist()  # count, mean
    (['loss'], [3.0, 1.0])
"""
import itertools
import numbers
import threading
import weakref
from typing import (Any, Dict, List, NamedTuple, Optional, Sequence, Tuple,
                    Union)

import numpy as np
import torch

from .moments import (NONFINITE, ROW_WIDTH, N, compact_rows, compact_tensors,
                      merge_rows, reduce_groups, reduce_tensor)
from .sketch import DEFAULT_BUCKETS, DeviceWindow, LogBuckets, Sketch

__all__ = [
    'Flush', 'PendingSketches', 'PendingStore', 'RootStore', 'name_error'
]

# A tensor with more elements is reduced to a row at report time.
LARGE_NUMEL = 4096
# Compact a name's pending values after this many reports.
MAX_PENDING_TENSORS = 256
MAX_PENDING_NUMBERS = 65536
MAX_PENDING_ROWS = 256
# The key of counts that arrived as host sketches (DataLoader workers).
HOST = 'host'

_F64 = torch.float64


class Flush(NamedTuple):
    """What a flush of the pending values hands to every live collector.

    Attributes:
        names (list[str]): The names with pending values, sorted.
        rows (Tensor): ``(len(names), ROW_WIDTH)`` float64 CPU moment rows
            (columns of :mod:`.moments`).
        counts (list[Sketch], optional): One sparse sketch per name, or
            None when no live collector sketches.

    Example:
        >>> store = RootStore(PendingSketches())
        >>> store.add('b', 1.0)
        >>> store.add('a', [2.0, 4.0])
        >>> flushed = store.flush()  # a Flush
        >>> flushed.names, flushed.rows[:, 1].tolist(), flushed.counts
        (['a', 'b'], [3.0, 1.0], None)
    """
    names: List[str]
    rows: torch.Tensor
    counts: Optional[list] = None


# -- value checks (the slow paths of report()) ------------------------------
def name_error(name: Any) -> TypeError:
    """The error of a name that is not a str.

    Example:
        >>> raise name_error(3)
        Traceback (most recent call last):
        ...
        TypeError: report(): the name must be a str, got int 3
    """
    return TypeError(f'report(): the name must be a str, got '
                     f'{type(name).__name__} {name!r}')


def _value_error(name: str, value: Any, why: str = '') -> TypeError:
    why = why or (f'must be a real number, sequence of real numbers, numpy '
                  f'array or tensor, got {type(value).__name__}')
    return TypeError(f'report({name!r}): the value {why}')


def _to_float(name: str, value: Any) -> float:
    """``float(value)`` or a ValueError naming ``name`` (ints beyond the
    float64 range, e.g. ``10**400``)."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f'report({name!r}): {value!r:.40} is beyond the '
                         f'float64 range') from None


def _check_tensor(name: str, value: torch.Tensor) -> None:
    """Reject tensors that cannot be read as real float64 values."""
    if value.layout is not torch.strided:
        raise _value_error(
            name, value, f'must be a dense (strided) tensor, '
            f'got layout {value.layout}')
    if value.is_meta:
        raise _value_error(name, value, 'is a meta tensor (it has no data)')
    if value.is_quantized or value.is_complex():
        raise _value_error(name, value, f'must be a real tensor, got '
                           f'{value.dtype}')


# -- sketch counts -----------------------------------------------------------
class PendingSketches:
    """Bucket counts of values reduced before the flush, per name and device.

    The sketch side of the pending stores: values that a store reduces at
    once (large tensors, compactions) are counted here on their device and
    without a sync, into one :class:`~.sketch.DeviceWindow` per name and
    device (``2 max_buckets + 4`` float64, merged in place of the previous
    one); counts from DataLoader workers arrive as host sketches.
    :meth:`flush` adds the host values' counts and empties it. Every store
    of a process shares one (the :class:`~.reporting.Reporter`'s).

    Args:
        buckets (LogBuckets): The layout. Defaults to ``DEFAULT_BUCKETS``.

    Example:
        >>> import numpy as np, torch
        >>> sketches = PendingSketches()
        >>> sketches.add('x', torch.ones(8))
        >>> [s.total for s in sketches.flush(['x'], np.zeros(0),
        ...                                     np.zeros(0, np.int64))]
        [8.0]
    """

    def __init__(self, buckets: LogBuckets = DEFAULT_BUCKETS) -> None:
        self.buckets = buckets
        self.counts: Dict[str, Dict[Any, Any]] = {}
        # True while some live collector sketches (read off the fast path)
        self.enabled = False
        # reporting threads add here; flush() takes
        self.lock = threading.Lock()

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's may have been held
        by another thread) and nothing pending."""
        self.lock = threading.Lock()
        self.counts = {}

    def reset(self) -> None:
        """Drop every pending count."""
        with self.lock:
            self.counts.clear()

    def add(self, name: str, values: torch.Tensor) -> None:
        """Count ``values`` under ``name`` (no sync)."""
        window = self.buckets.bucket_counts(values)
        if window is not None:
            self.add_counts(name, window)

    def add_counts(self, name: str, counts: Union[DeviceWindow,
                                                  Sketch]) -> None:
        """Add counts made elsewhere (a device window, or a host sketch
        from a DataLoader worker) under ``name``."""
        host = isinstance(counts, Sketch)
        key = HOST if host else counts.device
        with self.lock:
            per_device = self.counts.setdefault(name, {})
            total = per_device.get(key)
            if total is None:
                per_device[key] = counts.copy() if host else counts
            elif host:
                total += counts
            else:
                per_device[key] = self.buckets.merge_windows(total, counts)

    def add_many(self, name: str, tensors: List[torch.Tensor]) -> None:
        """Count several tensors (one kernel sequence per device)."""
        by_device: Dict[Any, List[torch.Tensor]] = {}
        for t in tensors:
            by_device.setdefault(t.device, []).append(t.reshape(-1))
        for flats in by_device.values():
            self.add(name, torch.cat(flats))

    def flush(self, names: List[str], values: np.ndarray,
              segs: np.ndarray) -> List[Sketch]:
        """Sketches of ``names`` in their order: the host ``values`` (group
        ``segs`` indexes ``names``) plus what :meth:`add` counted; then
        empty (syncs the devices used)."""
        out = self.buckets.group_bucket_counts(values, segs, len(names))
        index = {name: i for i, name in enumerate(names)}
        with self.lock:
            pending, self.counts = self.counts, {}
        for name, per_device in pending.items():
            if name in index:  # else reset since: dropped with its rows
                for counts in per_device.values():
                    if not isinstance(counts, Sketch):
                        counts = self.buckets.window_sketch(counts)
                    out[index[name]] += counts
        return out


# -- the stores --------------------------------------------------------------
class PendingStore:
    """Per-name values one thread reported since the last flush.

    Python numbers go to ``numbers``, small tensors (as float64 copies on
    their device) to ``tensors``, pre-reduced rows (large tensors,
    compactions) to ``rows``; ``empty`` holds names registered without
    values. Memory per name is bounded by compaction. Only the owning
    thread adds (:meth:`add`, :meth:`add_name`); the main thread's
    :class:`RootStore` takes under :attr:`lock`.

    Args:
        sketches (PendingSketches): Where values reduced at once are
            counted for quantiles (while ``sketches.enabled``).

    Example:
        >>> store = PendingStore(PendingSketches())
        >>> store.add('acc', [1, 0, 1])  # ints, bools: exact as float64
        >>> store.add_name('unused')  # published with num=0
        >>> sorted(store.take()[0]), sorted(store.take()[3])
        (['acc'], [])
    """

    def __init__(self, sketches: PendingSketches) -> None:
        self.sketches = sketches
        self.numbers: Dict[str, list] = {}
        self.tensors: Dict[str, List[torch.Tensor]] = {}
        self.rows: Dict[str, List[torch.Tensor]] = {}
        self.empty: set = set()
        # Held by the owning thread while it adds, by flush() while it takes.
        self.lock = threading.Lock()
        # Scratch of the large tensors' reductions (moments.reduce_tensor),
        # reused by this thread's later ones; dropped with the store.
        self.workspace: Dict[Any, torch.Tensor] = {}

    # -- adding ------------------------------------------------------------
    def add(self, name: str, value: Any) -> None:
        """Keep ``value`` under ``name``: the dispatch of ``report()``.

        Raises:
            TypeError: ``value`` is not real numbers.
            ValueError: a number is beyond the float64 range.
        """
        tp = type(value)
        lock = self.lock  # acquire/release: cheaper than ``with`` here
        lock.acquire()
        try:
            if tp is float:  # the fast path: one append
                nums = self.numbers.get(name)
                if nums is None:
                    self.numbers[name] = [value]
                else:
                    nums.append(value)
                    if len(nums) >= MAX_PENDING_NUMBERS:
                        self._compact_numbers(name)
            elif tp is torch.Tensor:
                self._add_tensor(name, value)
            else:
                self._add_other(name, value)
        finally:
            lock.release()

    def add_row(self,
                name: str,
                row: torch.Tensor,
                values: Optional[torch.Tensor] = None) -> None:
        """Keep a row reduced elsewhere (compiled code's
        :func:`~.moments.reduce_in_graph`) under ``name``; ``values``, if
        given, are counted for quantiles while some collector sketches."""
        with self.lock:
            if values is not None and self.sketches.enabled:
                self.sketches.add(name, values)
            self._add_row(name, row)

    def add_name(self, name: str) -> None:
        """Register ``name`` without a value (it is published, ``num=0``)."""
        with self.lock:
            self.empty.add(name)

    def _add_row(self, name: str, row: torch.Tensor) -> None:
        rows = self.rows.get(name)
        if rows is None:
            self.rows[name] = [row]
            return
        rows.append(row)
        if len(rows) >= MAX_PENDING_ROWS:
            self.rows[name] = compact_rows(rows)

    def _add_numbers(self, name: str, values: list) -> None:
        nums = self.numbers.get(name)
        if nums is None:
            self.numbers[name] = nums = []
        nums.extend(values)
        if len(nums) >= MAX_PENDING_NUMBERS:
            self._compact_numbers(name)

    def _compact_numbers(self, name: str) -> None:
        values = torch.tensor(self.numbers.pop(name), dtype=_F64)
        if self.sketches.enabled:
            self.sketches.add(name, values)
        self._add_row(name, reduce_tensor(values))

    def _add_tensor(self, name: str, value: torch.Tensor) -> None:
        numel = value.numel()
        if numel == 0:
            _check_tensor(name, value)
            self.empty.add(name)
            return
        if value.requires_grad:
            value = value.detach()
        _check_tensor(name, value)
        if numel > LARGE_NUMEL:
            if self.sketches.enabled:
                self.sketches.add(name, value)
            self._add_row(name, reduce_tensor(value, workspace=self.workspace))
            return
        # A float64 copy: later in-place changes by the caller cannot leak in.
        value = value.clone() if value.dtype is _F64 else value.double()
        tensors = self.tensors.get(name)
        if tensors is None:
            self.tensors[name] = [value]
            return
        tensors.append(value)
        if len(tensors) >= MAX_PENDING_TENSORS:
            del self.tensors[name]
            if self.sketches.enabled:
                self.sketches.add_many(name, tensors)
            for row in compact_tensors(tensors):
                self._add_row(name, row)

    def _add_other(self, name: str, value: Any) -> None:
        """Any value that is not a float or a plain tensor."""
        if isinstance(value, torch.Tensor):
            self._add_tensor(name, value)
        elif isinstance(value, (str, bytes, dict)) or value is None:
            raise _value_error(name, value)
        elif type(value) is int or isinstance(value, (bool, np.bool_)):
            self._add_numbers(name, [_to_float(name, value)])
        elif isinstance(value, numbers.Real):  # np.float32, Fraction..
            self._add_numbers(name, [_to_float(name, value)])
        elif isinstance(value, np.ndarray):
            self._add_array(name, value)
        elif isinstance(value, (Sequence, set, frozenset)):
            self._add_sequence(name, list(value))
        else:
            raise _value_error(name, value)

    def _add_array(self, name: str, value: np.ndarray) -> None:
        if value.dtype.kind not in 'biuf':
            raise _value_error(
                name, value, f'must be a real numpy array, got '
                f'dtype {value.dtype}')
        if value.size == 0:
            self.empty.add(name)
        else:  # np.array copies: later in-place changes cannot leak in
            values = np.array(value, dtype=np.float64).ravel()
            self._add_tensor(name, torch.from_numpy(values))

    def _add_sequence(self, name: str, values: list) -> None:
        if not values:
            self.empty.add(name)
        elif all(type(v) is float for v in values):
            self._add_numbers(name, values)
        elif all(type(v) in (float, int, bool) for v in values):
            self._add_numbers(name, [_to_float(name, v) for v in values])
        elif all(isinstance(v, torch.Tensor) for v in values):
            for v in values:
                _check_tensor(name, v)
            for v in values:
                self._add_tensor(name, v)
        else:  # nested sequences, numpy scalars: numpy decides, strictly
            try:
                array = np.asarray(values)
            except (TypeError, ValueError, OverflowError):
                raise _value_error(
                    name, values, 'is a sequence that is not a '
                    'rectangular array of real numbers') from None
            if array.dtype.kind not in 'biuf':  # None, strings, objects
                raise _value_error(
                    name, values, 'is a sequence that holds '
                    'something other than real numbers')
            self._add_array(name, array)

    # -- taking --------------------------------------------------------------
    def _clear(self) -> None:
        self.numbers.clear()
        self.tensors.clear()
        self.rows.clear()
        self.empty.clear()

    def take(self) -> Tuple[dict, dict, dict, set]:
        """Move the pending values out (under :attr:`lock`): numbers,
        tensors, rows and empty names."""
        with self.lock:
            taken = (dict(self.numbers), dict(self.tensors), dict(self.rows),
                     set(self.empty))
            self._clear()
        return taken

    def __bool__(self) -> bool:
        return bool(self.numbers or self.tensors or self.rows or self.empty)


class RootStore(PendingStore):
    """The main thread's store; also owns the list of every other thread's
    store, so that :meth:`flush` and :meth:`reset` cover all threads.

    Each thread adds to its own store (no shared list is ever appended to
    by two threads); a thread registers its store once, under a lock.

    Args:
        sketches (PendingSketches): Shared by every thread's store.

    Example:
        >>> import threading
        >>> root = RootStore(PendingSketches())
        >>> def worker():
        ...     store = root.new_thread_store()
        ...     store.add('t', 2.0)
        >>> thread = threading.Thread(target=worker)
        >>> thread.start(); thread.join()
        >>> root.add('t', 4.0)
        >>> root.flush().rows[0, :2].tolist()  # both threads' values
        [2.0, 3.0]
    """

    def __init__(self, sketches: PendingSketches) -> None:
        super().__init__(sketches)
        self._registry_lock = threading.Lock()
        self._others: List[Tuple[Any, PendingStore]] = []

    def new_thread_store(self) -> PendingStore:
        """A store for the calling thread, registered for the flushes."""
        store = PendingStore(self.sketches)
        thread = weakref.ref(threading.current_thread())
        with self._registry_lock:
            self._others.append((thread, store))
        return store

    def add_flush(self, flushed: Flush, prefix: str = '') -> None:
        """Add rows and sketches reduced elsewhere (a DataLoader worker's
        :meth:`flush`) under ``prefix + name``."""
        with self.lock:
            for name, row in zip(flushed.names, flushed.rows):
                if row[N] == 0 and row[NONFINITE] == 0:  # no value
                    self.empty.add(prefix + name)
                else:
                    self._add_row(prefix + name, row.clone())
        if flushed.counts is None or not self.sketches.enabled:
            return
        for name, sketch in zip(flushed.names, flushed.counts):
            if sketch.codes.size:
                self.sketches.add_counts(prefix + name, sketch)

    def after_fork_in_child(self) -> None:
        """Forget every pending value and every other thread's store (in a
        forked child: they are the parent's)."""
        self._registry_lock = threading.Lock()
        self._others = []
        self.lock = threading.Lock()
        self._clear()
        self.sketches.after_fork()

    def _drain_others(self) -> List[tuple]:
        with self._registry_lock:
            others = list(self._others)
            # Stores of finished threads are drained one last time below.
            self._others = [(t, s) for t, s in others
                            if t() is not None and t().is_alive()]
        return [store.take() for _, store in others]

    def take(self) -> Tuple[dict, dict, dict, set]:
        """Move every thread's pending values out, merged."""
        taken = self._drain_others()
        with self.lock:
            for nums, tensors, rows, empty in taken:
                for name, values in nums.items():
                    self.numbers.setdefault(name, []).extend(values)
                for name, values in tensors.items():
                    self.tensors.setdefault(name, []).extend(values)
                for name, values in rows.items():
                    self.rows.setdefault(name, []).extend(values)
                self.empty.update(empty)
        return super().take()

    def reset(self) -> None:
        """Drop every pending value and count of every thread."""
        self.take()
        self.sketches.reset()

    def flush(self, sketch: bool = False) -> Flush:
        """Reduce and drop every pending value of every thread (syncs the
        devices used).

        Args:
            sketch (bool): Also the names' sketch counts (while
                ``sketches.enabled``; see ``docs/quantiles.md``). Defaults
                to False.

        Returns:
            Flush: The sorted names, their merged ``(len(names),
            ROW_WIDTH)`` float64 CPU rows and, if ``sketch``, their
            sketches.
        """
        nums, tensors, rows, empty = self.take()
        names = sorted({*nums, *tensors, *rows, *empty})
        if not names:
            self.sketches.reset()
            return Flush(names, torch.zeros(0, ROW_WIDTH, dtype=_F64))
        index = {name: i for i, name in enumerate(names)}
        values, segs = _host_values(nums, tensors, index)
        counts = None
        if sketch and self.sketches.enabled:
            counts = self.sketches.flush(names, values, segs)
        else:
            self.sketches.reset()
        merged = torch.from_numpy(reduce_groups(values, segs, len(names)))
        flat_rows, flat_index = [], []
        for name, name_rows in rows.items():
            for row in name_rows:
                flat_rows.append(row.to('cpu'))
                flat_index.append(index[name])
        if flat_rows:  # pre-reduced rows: merge them in
            present = torch.from_numpy(np.unique(segs))
            merged = merge_rows(
                torch.cat([merged[present],
                           torch.stack(flat_rows)]),
                torch.cat(
                    [present,
                     torch.tensor(flat_index, dtype=torch.long)]), len(names))
        return Flush(names, merged, counts)


def _host_values(nums: Dict[str, list], tensors: Dict[str, list],
                 index: Dict[str, int]) -> Tuple[np.ndarray, np.ndarray]:
    """All pending numbers and small tensors as one host array and the
    group of each value (one copy to the host per device)."""
    values: List[np.ndarray] = []
    segs: List[np.ndarray] = []
    if nums:  # every name's numbers in one array, without a loop per name
        lengths = np.fromiter(map(len, nums.values()), np.int64, len(nums))
        values.append(
            np.fromiter(
                itertools.chain.from_iterable(nums.values()), np.float64,
                int(lengths.sum())))
        groups = np.fromiter((index[name] for name in nums), np.int64,
                             len(nums))
        segs.append(np.repeat(groups, lengths))
    by_device: Dict[Any, Tuple[list, list, list]] = {}
    for name, ts in tensors.items():
        for t in ts:
            flats, groups, counts = by_device.setdefault(
                t.device, ([], [], []))
            flats.append(t.reshape(-1))
            groups.append(index[name])
            counts.append(t.numel())
    for flats, groups, counts in by_device.values():
        values.append(torch.cat(flats).cpu().numpy())
        segs.append(np.repeat(np.asarray(groups, dtype=np.int64), counts))
    if len(values) == 1:
        return values[0], segs[0]
    if not values:
        return np.zeros(0), np.zeros(0, np.int64)
    return np.concatenate(values), np.concatenate(segs)
