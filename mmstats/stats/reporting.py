# Copyright (c) mmstats contributors. All rights reserved.
"""The report side: :func:`report`, :func:`report0`, :func:`phase` and the
one process-wide object of the report side, :data:`REPORTER` (a
:class:`Reporter`), which owns all of its state.

The state, all of it in :class:`Reporter` (StyleGAN3 keeps it in one table,
detectron2 in one ``EventStorage``, mmengine in one named ``MessageHub``):

=====================  ====================================================
``store``              values pending until the next flush: the main
                       thread's :class:`~.pending.RootStore`, which also
                       drains every other thread's store
``sketches``           quantile bucket counts of values reduced at report
                       time (:class:`~.pending.PendingSketches`), shared by
                       every thread's store
``enabled``            whether ``report()`` keeps anything: a collector is
                       live, or this is a DataLoader worker
``phase``              the prefix of reported names (``'val/'``)
``suspended``          > 0 inside :func:`suspend_reporting`
``_local``             each thread's own store (thread-local)
``_collectors``        the live collectors, as weak references (id -> ref);
                       ``_sketching``: the ids of those that sketch
``_in_worker``         this process is a DataLoader worker
``_started``           the fork handler is registered (at the first
                       collector or worker: importing changes nothing)
``compiled_report``    ``report()`` behind ``torch.compiler.disable`` for
                       compiled code's non-tensor values; None until the
                       first trace defines the ``mmstats::report_row`` and
                       ``mmstats::report`` ops
``_library``           their ``torch.library.Library``
``compat_names``       names reported through :mod:`mmstats.training_stats`
                       in order of first report (StyleGAN3's ``_counters``
                       keys); ``compat_collector``: its EDM2
                       ``default_collector``, once used
=====================  ====================================================

A forked child (a DataLoader worker) starts with nothing pending. Compiled
code calls the custom op (see :func:`enable_compile_support`); DataLoader
workers send their values with the batches (:mod:`.workers`, through
:meth:`Reporter.take` and :meth:`Reporter.add_flush`).
``docs/reporting.md`` explains each path and its cost;
``docs/architecture.md`` draws the way of a value.
"""
import os
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from mmengine.dist import get_rank

from mmstats.utils.torch_compat import (COMPILED_OPS, is_compiling,
                                        register_fake, require_torch)
from .moments import reduce_in_graph
from .pending import (Flush, PendingSketches, PendingStore, RootStore,
                      name_error)

__all__ = [
    'Reporter', 'REPORTER', 'report', 'report0', 'phase', 'suspend_reporting',
    'reset', 'enable_compile_support'
]

_is_compiling = is_compiling


class Reporter:
    """Owns the report side's state (the table in this module's docstring):
    pending values per thread, sketch counts, the live collectors and the
    ``enabled`` flag, the phase, suspension, fork handling, the worker
    hand-off and the compile support.

    There is one, :data:`REPORTER`; :func:`report` and :func:`report0` are
    module-level functions on it. Tests reset it with :meth:`reset`.

    Example:
        >>> from mmstats.stats.reporting import REPORTER
        >>> previous = REPORTER.set_phase('val')  # names get 'val/' in front
        >>> REPORTER.phase
        'val/'
        >>> REPORTER.set_phase(previous)
        'val'
        >>> REPORTER.phase
        ''
    """

    def __init__(self) -> None:
        self.sketches = PendingSketches()
        self.store = RootStore(self.sketches)
        self.enabled = False
        self.phase = ''
        self.suspended = 0
        self._local = threading.local()
        self._local.store = self.store
        self._collectors: Dict[int, Any] = {}  # id -> weakref
        self._sketching: set = set()  # ids of live collectors that sketch
        self._in_worker = False
        self._started = False
        self.compiled_report: Optional[Callable[[str, Any, bool], None]] = None
        self._library: Optional[Any] = None
        self.compat_names: Dict[str, None] = {}
        self.compat_collector: Optional[Any] = None

    def _start(self) -> None:
        """Register the fork handler, once: at the first collector or
        worker (importing mmstats changes nothing process-wide)."""
        if not self._started:
            self._started = True
            os.register_at_fork(after_in_child=self.after_fork_in_child)

    # -- collectors ---------------------------------------------------------
    def register(self, collector: Any, sketch: bool) -> None:
        """Make ``collector`` live until it is garbage-collected (values
        reported before belong to the collectors alive then: the new
        collector hands them to those first)."""
        self._start()
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
        self._start()
        self._in_worker = True
        self.enabled = True
        self.sketches.enabled = self.sketches.enabled or sketch

    # -- flushing -----------------------------------------------------------
    def take(self) -> Flush:
        """Reduce and drop every pending value of every thread (syncs the
        devices used); sketch counts only while some collector sketches."""
        return self.store.flush(sketch=self.sketches.enabled)

    def flush(self) -> Tuple[Flush, List[Any]]:
        """Everything pending, reduced once, and the collectors alive now,
        which share it (nothing is reduced when none is alive).

        Returns:
            tuple[Flush, list]: The flush and the live collectors.
        """
        collectors = self.live_collectors()
        if not collectors:
            self.store.reset()
            return Flush([], torch.zeros(0)), collectors
        return self.take(), collectors

    def add_flush(self, flushed: Flush, prefix: str = '') -> None:
        """Add rows and sketches reduced elsewhere (a DataLoader worker's
        :meth:`take`) under ``prefix + name``, unless nothing keeps values
        now.

        Args:
            flushed (Flush): Names, rows and (sparse) host sketches.
            prefix (str): E.g. the current phase. Defaults to ''.
        """
        if self.enabled and not self.suspended:
            self.store.add_flush(flushed, prefix)

    # -- phase and suspension -------------------------------------------------
    def set_phase(self, name: Optional[str]) -> Optional[str]:
        """Prefix names reported from now on with ``'<name>/'`` (None: no
        prefix); returns the previous phase."""
        previous = self.phase[:-1] or None
        self.phase = f'{name}/' if name else ''
        return previous

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
            store = self.store.new_thread_store()
            self._local.store = store
            return store

    def after_fork_in_child(self) -> None:
        """A forked child (e.g. a DataLoader worker) starts with nothing
        pending: its parent's values must not be counted twice."""
        self.store.after_fork_in_child()
        self._local = threading.local()
        self._local.store = self.store
        self.phase = ''

    def reset(self) -> None:
        """Forget every pending value, the phase and suspensions (live
        collectors stay registered)."""
        self.store.reset()
        self.phase = ''
        self.suspended = 0

    # -- mmstats.training_stats ---------------------------------------------
    def remember_name(self, name: str) -> None:
        """Note ``name`` for :meth:`mmstats.training_stats.Collector.names`
        (one entry per name, never values)."""
        if name not in self.compat_names:
            self.compat_names[name] = None

    def default_collector(self, build: Callable[[], Any]) -> Any:
        """EDM2's ``default_collector``: ``build()`` at the first call,
        the same object afterwards."""
        if self.compat_collector is None:
            self.compat_collector = build()
        return self.compat_collector

    # -- compiled code --------------------------------------------------------
    def enable_compile_support(self) -> None:
        """Define the ``mmstats::report`` op and the eager fallback (once;
        imports dynamo): see :func:`enable_compile_support`."""
        if self.compiled_report is not None:
            return
        require_torch(COMPILED_OPS, 'report() inside torch.compile')
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
        from torch.fx.node import has_side_effect

        # Eager report() behind torch.compiler.disable: the kernel (at run
        # time, inside a compiled region) and the graph break of non-tensor
        # values; dynamo never sees the store's frames.
        eager = torch.compiler.disable(_report_kernel)
        library = torch.library.Library('mmstats', 'FRAGMENT')
        library.define('report(Tensor value, str name, bool rank0) -> ()')
        library.impl('report', eager, 'CompositeExplicitAutograd')
        library.define('report_row(Tensor row, Tensor? values, str name, '
                       'bool rank0) -> ()')
        library.impl('report_row', _report_row_kernel,
                     'CompositeExplicitAutograd')
        for op, fake in (('report', _report_fake), ('report_row',
                                                    _report_row_fake)):
            register_fake(f'mmstats::{op}', fake, library)
            # No output: without this mark, dead-code elimination drops it.
            has_side_effect(getattr(torch.ops.mmstats, op).default)
        # Run eagerly after a graph break, with every frame they call (the
        # store's): dynamo would compile those and guard on the values.
        skip_all = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
        for fn in (report, report0, report_traced):
            set_code_exec_strategy(fn.__code__, skip_all)
        self._library = library
        self.compiled_report = eager


REPORTER = Reporter()


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
    store.add(name, value)
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
    reporter.thread_store().add_name(reporter.phase + name)
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

    Example:
        >>> from mmstats import Collector, report
        >>> from mmstats.stats import phase
        >>> collector = Collector()
        >>> previous = phase('val')
        >>> _ = report('acc', 1.0)
        >>> _ = phase(previous)
        >>> collector.update()
        >>> collector.names()
        ['val/acc']
    """
    return REPORTER.set_phase(name)


def suspend_reporting() -> Any:
    """Ignore every :func:`report` / :func:`report0` call inside the block.

    Used by :func:`mmstats.update_bn_stats`, so that values a model reports
    in its forward never reach a collector during a recomputation. Nests.

    Returns:
        A context manager.

    Example:
        >>> from mmstats import Collector, report
        >>> from mmstats.stats import suspend_reporting
        >>> collector = Collector()
        >>> with suspend_reporting():
        ...     _ = report('ignored', 1.0)
        >>> collector.update()
        >>> collector.names()
        []
    """
    return REPORTER.suspended_block()


def reset() -> None:
    """Forget every pending value, the phase and suspensions (for tests;
    live collectors stay registered): ``REPORTER.reset()``.

    Example:
        >>> from mmstats import Collector, report
        >>> from mmstats.stats import reset
        >>> collector = Collector()
        >>> _ = report('dropped', 1.0)
        >>> reset()
        >>> collector.update()
        >>> collector.names()
        []
    """
    REPORTER.reset()


# -- report() inside torch.compile ------------------------------------------
def _report_kernel(value: Any, name: str, rank0: bool) -> None:
    """The ``mmstats::report`` op's kernel (and, behind
    ``torch.compiler.disable``, the eager fallback): eager ``report()``."""
    (report0 if rank0 else report)(name, value)


def _report_fake(value: torch.Tensor, name: str, rank0: bool) -> None:
    return None


def _report_row_kernel(row: torch.Tensor, values: Optional[torch.Tensor],
                       name: str, rank0: bool) -> None:
    """The ``mmstats::report_row`` op's kernel: what :func:`report` does
    with a value, given the row compiled code reduced it to."""
    reporter = REPORTER
    if not reporter.enabled or reporter.suspended:
        return
    name = reporter.phase + name
    if rank0 and get_rank() != 0:
        reporter.thread_store().add_name(name)
    else:
        # a copy: inductor reuses the row's buffer once the op returns
        reporter.thread_store().add_row(name, row.clone(), values)


def _report_row_fake(row: torch.Tensor, values: Optional[torch.Tensor],
                     name: str, rank0: bool) -> None:
    return None


def _reduces_in_graph(value: torch.Tensor) -> bool:
    """Whether compiled code reduces ``value`` itself: non-empty real
    values of a strided layout (the others go to the eager checks)."""
    return (value.layout is torch.strided and not value.is_complex()
            and not value.is_quantized and value.device.type != 'meta'
            and value.numel() > 0)


def enable_compile_support() -> bool:
    """Prepare dynamo for ``report()`` (idempotent; imports dynamo).

    While dynamo traces, :func:`report` calls :func:`report_traced` instead
    of touching the store: a tensor value is reduced to its moments row
    inside the graph (:func:`~.moments.reduce_in_graph`, which inductor
    fuses into the kernels around it), and only the row leaves the graph,
    through ``mmstats::report_row(Tensor row, Tensor? values, str name,
    bool rank0) -> ()``, a ``torch.library`` op with a Python kernel,
    marked as having a side effect (``torch.fx.node.has_side_effect``) so
    that dead-code elimination keeps it although it returns nothing; its
    kernel does at run time what ``report()`` does with the row. Dynamo
    therefore guards on nothing of the store, the collectors, the phase or
    the suspension: they are read when the op runs, not when the graph is
    traced. One exception: while some collector sketches (quantiles) the
    values leave the graph too, for their bucket counts; that is read when
    tracing, so a sketching collector built (or the last one dropped) after
    a graph was compiled recompiles it once. Tensors ``report()`` rejects
    (complex, quantized, sparse, meta) and empty ones go through
    ``mmstats::report(Tensor value, str name, bool rank0) -> ()``, whose
    kernel is eager ``report()`` (and raises there). Other values (Python
    numbers, sequences, arrays) graph-break into an eager ``report()``
    (``torch.compiler.disable``): dynamo specialises a Python float it
    computes with, so a changing float (a learning rate) would recompile; a
    graph break passes it without a guard. The frames of ``report`` /
    ``report0`` / :func:`report_traced` are marked as skipped together with
    every frame they call: after such a graph break dynamo runs ``report``
    eagerly, and it would otherwise compile the store's methods as frames
    of their own and guard on the values (recompiling as they change).
    Inlining ``report()`` into a traced caller is not affected.

    Defining an op and importing ``torch._dynamo`` change process-wide
    state (dynamo adds classes to ``torch.serialization``'s safe globals),
    so ``import mmstats`` does neither: dynamo calls this function while it
    traces :func:`report_traced` (it is marked as a trace-time constant),
    when dynamo is imported anyway. See ``docs/reporting.md``.

    Returns:
        bool: True.

    Example:
        >>> import torch
        >>> enable_compile_support()  # the first trace of report() calls it
        True
        >>> torch.ops.mmstats.report.default  # defined now, not at import
        <OpOverload(op='mmstats.report', overload='default')>
    """
    REPORTER.enable_compile_support()
    return True


# What ``torch.compiler.assume_constant_result`` does, without importing
# dynamo: dynamo calls the function while tracing and keeps its result as a
# constant, so the first trace enables compile support before it reads
# ``REPORTER.compiled_report``. Checked by
# tests/test_stats/test_report_compile.py in a fresh interpreter.
enable_compile_support._dynamo_marked_constant = True  # type: ignore


def report_traced(name: str, value: Any, rank0: bool) -> Any:
    """What :func:`report` does while dynamo traces it.

    Example:
        >>> import torch
        >>> from mmstats import Collector
        >>> collector = Collector()
        >>> x = report_traced('x', torch.ones(2), rank0=False)  # runs eagerly
        >>> collector.update()
        >>> collector.num('x')  # the op's kernel reported it
        2.0
    """
    enable_compile_support()  # a trace-time constant
    if isinstance(value, torch.Tensor) and _reduces_in_graph(value):
        values = value.detach()
        # Only the row leaves the graph, and the values too while some
        # collector sketches (a guard: a change of that recompiles).
        torch.ops.mmstats.report_row(
            reduce_in_graph(values),
            values if REPORTER.sketches.enabled else None, name, rank0)
    elif isinstance(value, torch.Tensor):  # raises in the kernel, if live
        torch.ops.mmstats.report(value, name, rank0)
    else:
        REPORTER.compiled_report(value, name, rank0)
    return value
