# Copyright (c) mmstats contributors. All rights reserved.
"""The hand-off from the pending store to the collectors: which collectors
are alive (``report()`` keeps values only while one is) and :func:`flush`,
which reduces every pending value once and hands the rows to each of them.
"""
import weakref
from typing import Any, List

from .pending_sketches import SKETCHES
from .reporting import LIVE_COLLECTORS, STORE

__all__ = ['register', 'live_collectors', 'flush']

# ids of the live collectors that sketch (SKETCHES.enabled while any)
_SKETCHING: set = set()


def register(collector: Any, sketch: bool) -> None:
    """Make ``collector`` live until it is garbage-collected. Values
    reported before belong to the collectors alive then (flushed first)."""
    if LIVE_COLLECTORS:
        flush()
    key = id(collector)
    if sketch:
        _SKETCHING.add(key)
        SKETCHES.enabled = True
    LIVE_COLLECTORS[key] = weakref.ref(
        collector, lambda _, key=key: _forget(key))


def _forget(key: int) -> None:
    LIVE_COLLECTORS.pop(key, None)
    _SKETCHING.discard(key)
    SKETCHES.enabled = bool(_SKETCHING)
    if not LIVE_COLLECTORS:  # nobody will read them any more
        STORE.reset()


def live_collectors() -> List[Any]:
    """The collectors alive now."""
    refs = list(LIVE_COLLECTORS.values())
    return [c for c in (ref() for ref in refs) if c is not None]


def flush() -> None:
    """Reduce every pending value to one row per name and hand the rows to
    each live collector (its ``_receive`` keeps the names its regex
    matches; syncs the devices used)."""
    collectors = live_collectors()
    if not collectors:
        STORE.reset()
        return
    if SKETCHES.enabled:
        names, rows, counts = STORE.flush_with_sketches()
    else:
        (names, rows), counts = STORE.flush(), None
    if names:
        for collector in collectors:
            collector._receive(names, rows, counts)
