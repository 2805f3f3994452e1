# Copyright (c) mmstats contributors. All rights reserved.
"""Pending values: a :class:`PendingStore` per reporting thread, merged by
the :class:`RootStore` at flush (see ``docs/reporting.md``)."""
import threading
import weakref
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from .moments import (compact_rows, compact_tensors, merge_rows, reduce_groups,
                      reduce_tensor)
from .pending_sketches import SKETCHES
from .values import check_tensor

__all__ = ['PendingStore', 'RootStore']

# A tensor with more elements is reduced to a row at report time.
LARGE_NUMEL = 4096
# Compact a name's pending values after this many reports.
MAX_PENDING_TENSORS = 256
MAX_PENDING_NUMBERS = 65536
MAX_PENDING_ROWS = 256

_F64 = torch.float64


class PendingStore:
    """Per-name values reported since the last :meth:`flush`.

    Python numbers go to ``numbers``, small tensors (as float64 copies on
    their device) to ``tensors``, pre-reduced rows (large tensors,
    compactions) to ``rows``; ``empty`` holds names registered without
    values. Memory per name is bounded by compaction.
    """

    def __init__(self) -> None:
        self.numbers: Dict[str, list] = {}
        self.tensors: Dict[str, List[torch.Tensor]] = {}
        self.rows: Dict[str, List[torch.Tensor]] = {}
        self.empty: set = set()
        # Held by the owning thread while it adds, by flush() while it takes.
        self.lock = threading.Lock()

    def clear(self) -> None:
        """Drop every pending value of this store (in place)."""
        self.numbers.clear()
        self.tensors.clear()
        self.rows.clear()
        self.empty.clear()

    def reset(self) -> None:
        """Drop every pending value (in place: aliases stay valid)."""
        self.clear()

    def take(self) -> Tuple[dict, dict, dict, set]:
        """Move the pending values out (under :attr:`lock`)."""
        with self.lock:
            taken = (dict(self.numbers), dict(self.tensors), dict(self.rows),
                     set(self.empty))
            self.clear()
        return taken

    def absorb(self, taken: Tuple[dict, dict, dict, set]) -> None:
        """Add values moved out of another store by :meth:`take`."""
        nums, tensors, rows, empty = taken
        for name, values in nums.items():
            self.numbers.setdefault(name, []).extend(values)
        for name, values in tensors.items():
            self.tensors.setdefault(name, []).extend(values)
        for name, values in rows.items():
            self.rows.setdefault(name, []).extend(values)
        self.empty.update(empty)

    def __bool__(self) -> bool:
        return bool(self.numbers or self.tensors or self.rows or self.empty)

    # -- adding ------------------------------------------------------------
    def add_row(self, name: str, row: torch.Tensor) -> None:
        rows = self.rows.get(name)
        if rows is None:
            self.rows[name] = [row]
            return
        rows.append(row)
        if len(rows) >= MAX_PENDING_ROWS:
            self.rows[name] = compact_rows(rows)

    def add_numbers(self, name: str, values: list) -> None:
        nums = self.numbers.get(name)
        if nums is None:
            self.numbers[name] = nums = []
        nums.extend(values)
        if len(nums) >= MAX_PENDING_NUMBERS:
            self.compact_numbers(name)

    def compact_numbers(self, name: str) -> None:
        values = torch.tensor(self.numbers.pop(name), dtype=_F64)
        if SKETCHES.enabled:
            SKETCHES.add(name, values)
        self.add_row(name, reduce_tensor(values))

    def add_tensor(self, name: str, value: torch.Tensor) -> None:
        numel = value.numel()
        if numel == 0:
            check_tensor(name, value)
            self.empty.add(name)
            return
        if value.requires_grad:
            value = value.detach()
        check_tensor(name, value)
        if numel > LARGE_NUMEL:
            if SKETCHES.enabled:
                SKETCHES.add(name, value)
            self.add_row(name, reduce_tensor(value))
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
            if SKETCHES.enabled:
                SKETCHES.add_many(name, tensors)
            for row in compact_tensors(tensors):
                self.add_row(name, row)

    # -- flushing ----------------------------------------------------------
    def flush(self) -> Tuple[List[str], torch.Tensor]:
        """Reduce and drop everything pending (syncs the devices used).

        Returns:
            tuple[list[str], Tensor]: The sorted names and their merged
            ``(len(names), ROW_WIDTH)`` float64 CPU rows.
        """
        names, merged, _ = self.flush_with_sketches(False)
        return names, merged

    def flush_with_sketches(self, sketch: bool = True) -> tuple:
        """:meth:`flush`, plus the names' sketch counts
        (``(len(names), size)``, see ``docs/quantiles.md``) if ``sketch``
        and some collector sketches, else None."""
        nums, tensors, rows, empty = self.take()
        names = sorted({*nums, *tensors, *rows, *empty})
        if not names:
            SKETCHES.reset()
            return names, torch.zeros(0, 6, dtype=_F64), None
        index = {name: i for i, name in enumerate(names)}
        values, segs = _host_values(nums, tensors, index)
        counts = None
        if sketch and SKETCHES.enabled:
            counts = SKETCHES.flush(names, values, segs)
        else:
            SKETCHES.reset()
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
        return names, merged, counts


def _host_values(nums: Dict[str, list], tensors: Dict[str, list],
                 index: Dict[str, int]) -> Tuple[np.ndarray, np.ndarray]:
    """All pending numbers and small tensors as one host array and the
    group of each value (one copy to the host per device)."""
    values: List[np.ndarray] = []
    segs: List[np.ndarray] = []
    for name, lst in nums.items():
        values.append(np.asarray(lst, dtype=np.float64))
        segs.append(np.full(len(lst), index[name], dtype=np.int64))
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


class RootStore(PendingStore):
    """The main thread's store; also owns the list of every other thread's
    store, so that :meth:`flush` and :meth:`reset` cover all threads.

    Each thread adds to its own store (no shared list is ever appended to
    by two threads); a thread registers its store once, under a lock.
    """

    def __init__(self) -> None:
        super().__init__()
        self._registry_lock = threading.Lock()
        self._others: List[Tuple[Any, PendingStore]] = []

    def register(self, store: PendingStore) -> None:
        """Register the calling thread's new ``store``."""
        thread = weakref.ref(threading.current_thread())
        with self._registry_lock:
            self._others.append((thread, store))

    def forget_threads(self) -> None:
        """Forget every other thread's store (in a forked child)."""
        self._registry_lock = threading.Lock()
        self._others = []
        self.lock = threading.Lock()
        self.clear()

    def _drain_others(self) -> List[tuple]:
        with self._registry_lock:
            others = list(self._others)
            # Stores of finished threads are drained one last time below.
            self._others = [(t, s) for t, s in others
                            if t() is not None and t().is_alive()]
        return [store.take() for _, store in others]

    def take(self) -> Tuple[dict, dict, dict, set]:
        taken = self._drain_others()
        with self.lock:
            for other in taken:
                self.absorb(other)
        return super().take()

    def reset(self) -> None:
        """Drop every pending value of every thread."""
        self.take()
