# Copyright (c) mmstats contributors. All rights reserved.
"""The reporting side: :func:`report`, :func:`report0`, :func:`phase` and the
process-wide store of values pending until the next ``Collector.update()``.

Values are only kept while at least one collector is alive (registered in
:data:`LIVE_COLLECTORS`); with none, ``report()`` returns at once. Each
thread adds to its own store; compiled code calls a custom op
(:mod:`.compile`); DataLoader workers send their values with the batches
(:mod:`.workers`). ``docs/reporting.md`` explains each path and its cost.
"""
import os
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional

import torch
from mmengine.dist import get_rank

from .pending_sketches import SKETCHES
from .store import (LARGE_NUMEL, MAX_PENDING_NUMBERS, MAX_PENDING_ROWS,
                    MAX_PENDING_TENSORS, PendingStore, RootStore)
from .values import add_value, name_error

__all__ = [
    'report', 'report0', 'phase', 'suspend_reporting', 'reset', 'PendingStore',
    'STORE', 'LIVE_COLLECTORS', 'LARGE_NUMEL', 'MAX_PENDING_NUMBERS',
    'MAX_PENDING_ROWS', 'MAX_PENDING_TENSORS'
]

# The process-wide state (cleared by :func:`reset`). STORE is the main
# thread's store and merges every other thread's at flush.
STORE = RootStore()
# Live collectors: id -> weakref; ``report`` returns at once when empty.
LIVE_COLLECTORS: Dict[Any, Any] = {}
_PHASE = ['']  # prefix of reported names, e.g. 'val/' during validation
_SUSPENDED = [0]  # > 0 inside ``suspend_reporting()``
_LOCAL = threading.local()
_LOCAL.store = STORE
_is_compiling = torch.compiler.is_compiling


def _thread_store() -> PendingStore:
    """The calling thread's store, created and registered once."""
    store = PendingStore()
    _LOCAL.store = store
    STORE.register(store)
    return store


def _after_fork_in_child() -> None:
    """A forked child (e.g. a DataLoader worker) starts with nothing
    pending: its parent's values must not be counted twice."""
    global _LOCAL
    STORE.forget_threads()
    SKETCHES.lock = threading.Lock()
    SKETCHES.counts = {}
    _LOCAL = threading.local()
    _LOCAL.store = STORE
    _PHASE[0] = ''


os.register_at_fork(after_in_child=_after_fork_in_child)


def reset() -> None:
    """Forget every pending value, the phase and suspensions (for tests;
    live collectors stay registered)."""
    STORE.reset()
    SKETCHES.reset()
    _PHASE[0] = ''
    _SUSPENDED[0] = 0


def report(name: str, value: Any) -> Any:
    """Record ``value`` under statistic ``name`` and return it unchanged.

    Callable from anywhere: forward, loss, hooks, threads, compiled code,
    DataLoader workers (see ``docs/reporting.md``). Tensors are detached;
    never synchronises host and device; later in-place changes of ``value``
    are not recorded. Values are only kept while a
    :class:`~mmstats.Collector` is alive.

    Args:
        name (str): Name of the statistic.
        value (float | int | bool | Sequence | np.ndarray | Tensor): Real
            values of any shape, dtype and device. An empty value only
            registers the name.

    Returns:
        The same ``value`` object.

    Raises:
        TypeError: ``name`` is not a str, or ``value`` is not real numbers
            (strings, None, objects, complex, sparse, meta, quantized).
        ValueError: a number is beyond the float64 range.
        Both only while a collector is alive.

    Example:
        >>> import torch
        >>> from mmstats import Collector, report
        >>> collector = Collector(regex='loss|feat_norm')
        >>> loss = report('loss', torch.tensor(0.5))  # returns its value
        >>> _ = report('feat_norm', [1.0, 2.0, 3.0])  # every element counts
        >>> collector.update()  # a collective: every rank calls it
        >>> collector.num('feat_norm'), collector.mean('feat_norm')
        (3.0, 2.0)
    """
    if _is_compiling():
        return report_traced(name, value, False)
    if not LIVE_COLLECTORS or _SUSPENDED[0]:
        return value
    if type(name) is not str:
        raise name_error(name)
    if _PHASE[0]:
        name = _PHASE[0] + name
    try:
        store = _LOCAL.store
    except AttributeError:
        store = _thread_store()
    tp = type(value)
    with store.lock:
        if tp is float:
            nums = store.numbers.get(name)
            if nums is None:
                store.numbers[name] = [value]
            else:
                nums.append(value)
                if len(nums) >= MAX_PENDING_NUMBERS:
                    store.compact_numbers(name)
        elif tp is torch.Tensor:
            store.add_tensor(name, value)
        else:
            add_value(store, name, value)
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
    if _is_compiling():
        return report_traced(name, value, True)
    if not LIVE_COLLECTORS or _SUSPENDED[0]:
        return value
    if get_rank() == 0:
        return report(name, value)
    if type(name) is not str:
        raise name_error(name)
    try:
        store = _LOCAL.store
    except AttributeError:
        store = _thread_store()
    with store.lock:
        store.empty.add(_PHASE[0] + name)
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


def current_phase() -> str:
    """The prefix :func:`report` adds now (``''`` or ``'<phase>/'``)."""
    return _PHASE[0]


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


from .compile import report_traced  # noqa: E402 (it uses report)
