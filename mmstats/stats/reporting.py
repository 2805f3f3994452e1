# Copyright (c) mmstats contributors. All rights reserved.
"""The reporting side: :func:`report`, :func:`report0`, :func:`phase` and the
process-wide store of values pending until the next ``Collector.update()``.

Values are only kept while at least one collector is alive (registered in
:data:`LIVE_COLLECTORS`); with none, ``report()`` returns at once.
"""
import numbers
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.dist import get_rank

from .moments import (compact_rows, compact_tensors, merge_rows,
                      reduce_groups, reduce_values)

__all__ = [
    'report', 'report0', 'phase', 'suspend_reporting', 'reset',
    'PendingStore', 'STORE', 'LIVE_COLLECTORS'
]

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

    def reset(self) -> None:
        """Drop every pending value (in place: aliases stay valid)."""
        self.numbers.clear()
        self.tensors.clear()
        self.rows.clear()
        self.empty.clear()

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
        self.add_row(name, reduce_values(values)[0])

    def add_tensor(self, name: str, value: torch.Tensor) -> None:
        numel = value.numel()
        if numel == 0:
            if value.is_complex():
                raise _type_error(name, value)
            self.empty.add(name)
            return
        if value.requires_grad:
            value = value.detach()
        if value.is_complex():
            raise _type_error(name, value)
        if numel > LARGE_NUMEL:
            self.add_row(name, reduce_values(value.reshape(-1).to(_F64))[0])
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
            for row in compact_tensors(tensors):
                self.add_row(name, row)

    # -- flushing ----------------------------------------------------------
    def flush(self) -> Tuple[List[str], torch.Tensor]:
        """Reduce and drop everything pending (syncs the devices used).

        Returns:
            tuple[list[str], Tensor]: The sorted names and their merged
            ``(len(names), ROW_WIDTH)`` float64 CPU rows.
        """
        nums, tensors = dict(self.numbers), dict(self.tensors)
        rows, empty = dict(self.rows), set(self.empty)
        self.reset()
        names = sorted({*nums, *tensors, *rows, *empty})
        if not names:
            return names, torch.zeros(0, 6, dtype=_F64)
        index = {name: i for i, name in enumerate(names)}
        values, segs = _host_values(nums, tensors, index)
        merged = torch.from_numpy(reduce_groups(values, segs, len(names)))
        flat_rows, flat_index = [], []
        for name, name_rows in rows.items():
            for row in name_rows:
                flat_rows.append(row.to('cpu'))
                flat_index.append(index[name])
        if flat_rows:  # pre-reduced rows: merge them in
            present = torch.from_numpy(np.unique(segs))
            merged = merge_rows(
                torch.cat([merged[present], torch.stack(flat_rows)]),
                torch.cat([present,
                           torch.tensor(flat_index, dtype=torch.long)]),
                len(names))
        return names, merged


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
            flats, groups, counts = by_device.setdefault(t.device,
                                                         ([], [], []))
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


# The process-wide state (cleared by :func:`reset`).
STORE = PendingStore()
# Live collectors: id -> weakref; ``report`` returns at once when empty.
LIVE_COLLECTORS: Dict[int, Any] = {}
_PHASE = ['']  # prefix of reported names, e.g. 'val/' during validation
_SUSPENDED = [0]  # > 0 inside ``suspend_reporting()``


def reset() -> None:
    """Forget every pending value, the phase and suspensions (for tests;
    live collectors stay registered)."""
    STORE.reset()
    _PHASE[0] = ''
    _SUSPENDED[0] = 0


def _type_error(name: str, value: Any) -> TypeError:
    return TypeError(
        f'report({name!r}): value must be a number, sequence, numpy array '
        f'or tensor, got {type(value).__name__}')


def _report_other(name: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        STORE.add_tensor(name, value)
    elif isinstance(value, (str, bytes, dict)) or value is None:
        raise _type_error(name, value)
    elif isinstance(value, (bool, np.bool_)):
        STORE.add_numbers(name, [int(value)])
    elif isinstance(value, numbers.Real):  # np.float32, np.int64, Fraction..
        STORE.add_numbers(name, [float(value)])
    elif isinstance(value, np.ndarray):
        if value.dtype.kind not in 'biuf':
            raise _type_error(name, value)
        if value.size == 0:
            STORE.empty.add(name)
        else:  # np.array copies: later in-place changes cannot leak in
            values = np.array(value, dtype=np.float64).ravel()
            STORE.add_tensor(name, torch.from_numpy(values))
    elif isinstance(value, (Sequence, set, frozenset)):
        _report_sequence(name, list(value))
    else:
        raise _type_error(name, value)


def _report_sequence(name: str, values: list) -> None:
    if not values:
        STORE.empty.add(name)
    elif all(type(v) in (float, int, bool) for v in values):
        STORE.add_numbers(name, values)
    elif all(isinstance(v, torch.Tensor) for v in values):
        for v in values:
            STORE.add_tensor(name, v)
    else:
        try:
            array = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise _type_error(name, values) from None
        _report_other(name, array)


def report(name: str, value: Any) -> Any:
    """Record ``value`` under statistic ``name`` and return it unchanged.

    Callable from anywhere (loss functions, ``nn.Module.forward``, hooks,
    under ``torch.no_grad`` or autograd: tensors are detached). Never
    synchronises host and device and never communicates. Later in-place
    changes of ``value`` do not change what was recorded. Values are only
    kept while a :class:`~mmstats.Collector` is alive.

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
    if not LIVE_COLLECTORS or _SUSPENDED[0]:
        return value
    if _PHASE[0]:
        name = _PHASE[0] + name
    tp = type(value)
    if tp is float or tp is int:
        nums = STORE.numbers.get(name)
        if nums is None:
            STORE.numbers[name] = [value]
        else:
            nums.append(value)
            if len(nums) >= MAX_PENDING_NUMBERS:
                STORE.compact_numbers(name)
    elif tp is torch.Tensor:
        STORE.add_tensor(name, value)
    else:
        _report_other(name, value)
    return value


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
    if not LIVE_COLLECTORS or _SUSPENDED[0]:
        return value
    if get_rank() == 0:
        return report(name, value)
    STORE.empty.add(_PHASE[0] + name)
    return value


def phase(name: Optional[str]) -> Optional[str]:
    """Prefix every name reported from now on with ``'<name>/'``.

    StatsCollectorHook calls ``phase('val')`` while a validation loop runs,
    so ``report('model/feat_norm', x)`` in a module's ``forward`` is recorded
    as ``val/model/feat_norm``, apart from the training values.

    Args:
        name (str, optional): The phase, e.g. ``'val'``; None for none.

    Returns:
        str or None: The previous phase, to restore it.
    """
    previous = _PHASE[0][:-1] or None
    _PHASE[0] = f'{name}/' if name else ''
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
