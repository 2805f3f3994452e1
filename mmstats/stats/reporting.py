# Copyright (c) mmstats contributors. All rights reserved.
"""The report side: :func:`report`, :func:`report0`, :func:`phase` and the
one object that owns every piece of the report side's process state,
:data:`REPORTER` (a :class:`Reporter`).

The state, all of it here (StyleGAN3 keeps it in one table, detectron2 in
one ``EventStorage``, mmengine in one named ``MessageHub``):

=====================  ====================================================
``store``              values pending until the next flush: the main
                       thread's :class:`~.store.RootStore`, which also
                       drains every other thread's store
``sketches``           quantile bucket counts of values reduced at report
                       time (:data:`~.pending_sketches.SKETCHES`)
``enabled``            whether ``report()`` keeps anything: a collector is
                       live, or this is a DataLoader worker
``phase``              the prefix of reported names (``'val/'``)
``suspended``          > 0 inside :meth:`Reporter.suspended`
per-thread stores      each thread adds to its own store
live collectors        weak references; each gets every :class:`Flush`
=====================  ====================================================

A forked child (a DataLoader worker) starts with nothing pending. Compiled
code calls a custom op (:mod:`.compile`); DataLoader workers send their
values with the batches (:mod:`.workers`, through :meth:`Reporter.take`
and :meth:`Reporter.add_rows`). ``docs/reporting.md`` explains each path and
its cost; ``docs/architecture.md`` draws the way of a value.
"""
import os
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, NamedTuple, Optional

import torch
from mmengine.dist import get_rank

from .moments import NONFINITE, N
from .pending_sketches import SKETCHES
from .store import MAX_PENDING_NUMBERS, PendingStore, RootStore
from .values import add_value, name_error

__all__ = [
    'Flush', 'Reporter', 'REPORTER', 'report', 'report0', 'phase',
    'suspend_reporting', 'reset'
]

_is_compiling = torch.compiler.is_compiling


class Flush(NamedTuple):
    """What one flush hands to every live collector.

    Attributes:
        names (list[str]): The names with pending values, sorted.
        rows (Tensor): ``(len(names), ROW_WIDTH)`` float64 CPU moment rows
            (columns of :mod:`.moments`).
        counts (list[Sketch], optional): One sparse sketch per name, or
            None when no live collector sketches.
    """
    names: List[str]
    rows: torch.Tensor
    counts: Optional[list] = None


class Reporter:
    """Owns the report side: pending values per thread, sketch counts, the
    live collectors and the ``enabled`` flag, the phase, suspension, fork
    handling and the worker hand-off.

    There is one, :data:`REPORTER`; :func:`report` and :func:`report0` are
    module-level functions on it. Tests reset it with :meth:`reset`.

    Example:
        >>> from mmstats.stats.reporting import REPORTER
        >>> with REPORTER.in_phase('val'):  # names get 'val/' in front
        ...     REPORTER.phase
        'val/'
        >>> REPORTER.phase
        ''
    """

    def __init__(self) -> None:
        self.store = RootStore()
        self.sketches = SKETCHES
        self.enabled = False
        self.phase = ''
        self.suspended = 0
        self._local = threading.local()
        self._local.store = self.store
        self._collectors: Dict[Any, Any] = {}  # id -> weakref
        self._sketching: set = set()  # ids of live collectors that sketch
        self._in_worker = False

    # -- collectors ---------------------------------------------------------
    def register(self, collector: Any, sketch: bool) -> None:
        """Make ``collector`` live until it is garbage-collected; it then
        gets every :class:`Flush` through ``collector.receive``. Values
        reported before belong to the collectors alive then (flushed
        first)."""
        if self._collectors:
            self.flush()
        key = id(collector)
        if sketch:
            self._sketching.add(key)
            self.sketches.enabled = True
        self._collectors[key] = weakref.ref(
            collector, lambda _, key=key: self._forget(key))
        self.enabled = True

    def _forget(self, key: int) -> None:
        self._collectors.pop(key, None)
        self._sketching.discard(key)
        self.sketches.enabled = bool(
            self._sketching) or (self._in_worker and self.sketches.enabled)
        self.enabled = bool(self._collectors) or self._in_worker
        if not self.enabled:  # nobody will read them any more
            self.store.reset()

    def live_collectors(self) -> List[Any]:
        """The collectors alive now."""
        refs = list(self._collectors.values())
        return [c for c in (ref() for ref in refs) if c is not None]

    def enable_in_worker(self, sketch: bool) -> None:
        """Keep reported values in a DataLoader worker (no collector lives
        there: they leave with the batches, see :mod:`.workers`)."""
        self._in_worker = True
        self.enabled = True
        self.sketches.enabled = self.sketches.enabled or sketch

    # -- flushing -----------------------------------------------------------
    def take(self) -> Flush:
        """Reduce and drop every pending value of every thread (syncs the
        devices used); sketch counts only while some collector sketches."""
        if self.sketches.enabled:
            return Flush(*self.store.flush_with_sketches())
        return Flush(*self.store.flush())

    def flush(self) -> None:
        """Hand everything pending, reduced once, to each live collector
        (``collector.receive(flush)`` keeps the names its regex matches)."""
        collectors = self.live_collectors()
        if not collectors:
            self.store.reset()
            return
        flushed = self.take()
        if flushed.names:
            for collector in collectors:
                collector.receive(flushed)

    def add_rows(self, flushed: Flush, prefix: str = '') -> None:
        """Add rows and sketches reduced elsewhere (a DataLoader worker's
        :meth:`take`) under ``prefix + name``, unless nothing keeps values
        now.

        Args:
            flushed (Flush): Names, rows and (sparse) host sketches.
            prefix (str): E.g. the current phase. Defaults to ''.
        """
        if not self.enabled or self.suspended:
            return
        store = self.store
        with store.lock:
            for name, row in zip(flushed.names, flushed.rows):
                if row[N] == 0 and row[NONFINITE] == 0:  # no value
                    store.empty.add(prefix + name)
                else:
                    store.add_row(prefix + name, row.clone())
        if flushed.counts is None or not self.sketches.enabled:
            return
        for name, sketch in zip(flushed.names, flushed.counts):
            if sketch.codes.size:
                self.sketches.add_counts(prefix + name, sketch)

    # -- phase and suspension -------------------------------------------------
    def set_phase(self, name: Optional[str]) -> Optional[str]:
        """Prefix names reported from now on with ``'<name>/'`` (None: no
        prefix); returns the previous phase."""
        previous = self.phase[:-1] or None
        self.phase = f'{name}/' if name else ''
        return previous

    @contextmanager
    def in_phase(self, name: Optional[str]) -> Iterator[None]:
        """:meth:`set_phase` for the block (detectron2's ``name_scope``)."""
        previous = self.set_phase(name)
        try:
            yield
        finally:
            self.set_phase(previous)

    @contextmanager
    def suspended_block(self) -> Iterator[None]:
        """Ignore every report inside the block (nests)."""
        self.suspended += 1
        try:
            yield
        finally:
            self.suspended -= 1

    # -- threads, forks, tests ----------------------------------------------
    def thread_store(self) -> PendingStore:
        """The calling thread's store, created and registered once."""
        try:
            return self._local.store
        except AttributeError:
            store = PendingStore()
            self._local.store = store
            self.store.register(store)
            return store

    def after_fork_in_child(self) -> None:
        """A forked child (e.g. a DataLoader worker) starts with nothing
        pending: its parent's values must not be counted twice."""
        self.store.forget_threads()
        self.sketches.after_fork()
        self._local = threading.local()
        self._local.store = self.store
        self.phase = ''

    def reset(self) -> None:
        """Forget every pending value, the phase and suspensions (live
        collectors stay registered)."""
        self.store.reset()
        self.sketches.reset()
        self.phase = ''
        self.suspended = 0


REPORTER = Reporter()
os.register_at_fork(after_in_child=REPORTER.after_fork_in_child)


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
    reporter = REPORTER
    if not reporter.enabled or reporter.suspended:
        return value
    if type(name) is not str:
        raise name_error(name)
    if reporter.phase:
        name = reporter.phase + name
    try:
        store = reporter._local.store
    except AttributeError:
        store = reporter.thread_store()
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

    Example:
        >>> from mmstats import Collector, report0
        >>> collector = Collector(regex='lr')
        >>> _ = report0('lr', 0.1)  # counted on rank 0, only named elsewhere
        >>> collector.update()  # a collective: every rank calls it
        >>> collector.num('lr'), collector.mean('lr')  # the same on every rank
        (1.0, 0.1)
    """
    if _is_compiling():
        return report_traced(name, value, True)
    reporter = REPORTER
    if not reporter.enabled or reporter.suspended:
        return value
    if get_rank() == 0:
        return report(name, value)
    if type(name) is not str:
        raise name_error(name)
    store = reporter.thread_store()
    with store.lock:
        store.empty.add(reporter.phase + name)
    return value


def phase(name: Optional[str]) -> Optional[str]:
    """Prefix every name reported from now on with ``'<name>/'``.

    StatsCollectorHook calls ``phase('val')`` while a validation loop runs,
    so ``report('model/feat_norm', x)`` in a module's ``forward`` is recorded
    as ``val/model/feat_norm``, apart from the training values.
    ``REPORTER.in_phase(name)`` is the same as a context manager.

    Args:
        name (str, optional): The phase, e.g. ``'val'``; None for none.

    Returns:
        str or None: The previous phase, to restore it.
    """
    return REPORTER.set_phase(name)


def suspend_reporting():
    """Ignore every :func:`report` / :func:`report0` call inside the block.

    Used by :func:`mmstats.update_bn_stats`, so that values a model reports
    in its forward never reach a collector during a recomputation. Nests.
    """
    return REPORTER.suspended_block()


def reset() -> None:
    """Forget every pending value, the phase and suspensions (for tests;
    live collectors stay registered): ``REPORTER.reset()``."""
    REPORTER.reset()


from .compile import report_traced  # noqa: E402 (it uses report)
