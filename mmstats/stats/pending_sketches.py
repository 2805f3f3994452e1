# Copyright (c) mmstats contributors. All rights reserved.
"""Sketch counts pending until the next flush, shared by every reporting
thread (the sketch side of :mod:`.store`; kernels in :mod:`.sketch`)."""
import threading
from typing import Any, Dict, List, Union

import numpy as np
import torch

from .sketch import DEFAULT_BUCKETS, DeviceWindow, LogBuckets, Sketch

__all__ = ['PendingSketches', 'SKETCHES']

HOST = 'host'


class PendingSketches:
    """Bucket counts of values reduced before the flush, per name and device.

    The sketch side of the pending store: values that report() reduces at
    once (large tensors, compactions) are counted here on their device and
    without a sync, into one :class:`~.sketch.DeviceWindow` per name and
    device (``2 max_buckets + 4`` float64, merged in place of the previous
    one); counts from DataLoader workers arrive as host sketches.
    :meth:`flush` adds the host values' counts and empties it.

    Args:
        buckets (LogBuckets): The layout. Defaults to ``DEFAULT_BUCKETS``.
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


# Counts of values reduced before the flush, shared by every thread's store.
SKETCHES = PendingSketches()
