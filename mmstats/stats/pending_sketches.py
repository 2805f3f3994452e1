# Copyright (c) mmstats contributors. All rights reserved.
"""Sketch counts pending until the next flush, shared by every reporting
thread (the sketch side of :mod:`.store`; kernels in :mod:`.sketch`)."""
import threading
from typing import Any, Dict, List

import numpy as np
import torch

from .sketch import DEFAULT_BUCKETS, LogBuckets

__all__ = ['PendingSketches', 'SKETCHES']


class PendingSketches:
    """Bucket counts of values reduced before the flush, per name and device.

    The sketch side of the pending store: values that report() reduces at
    once (large tensors, compactions) are counted here on their device and
    without a sync, one fixed-size vector per name and device (added to in
    place); :meth:`flush` adds the host values' counts and empties it.

    Args:
        buckets (LogBuckets): The layout. Defaults to ``DEFAULT_BUCKETS``.
    """

    def __init__(self, buckets: LogBuckets = DEFAULT_BUCKETS) -> None:
        self.buckets = buckets
        self.counts: Dict[str, Dict[Any, torch.Tensor]] = {}
        # True while some live collector sketches (read off the fast path)
        self.enabled = False
        # reporting threads add here; flush() takes
        self.lock = threading.Lock()

    def reset(self) -> None:
        """Drop every pending count."""
        with self.lock:
            self.counts.clear()

    def add(self, name: str, values: torch.Tensor) -> None:
        """Count ``values`` under ``name`` (no sync)."""
        self.add_counts(name, self.buckets.bucket_counts(values))

    def add_counts(self, name: str, counts: torch.Tensor) -> None:
        """Add bucket ``counts`` counted elsewhere (e.g. in a DataLoader
        worker) under ``name``."""
        with self.lock:
            per_device = self.counts.setdefault(name, {})
            total = per_device.get(counts.device)
            if total is None:
                per_device[counts.device] = counts
            else:
                total.add_(counts)

    def add_many(self, name: str, tensors: List[torch.Tensor]) -> None:
        """Count several tensors (one kernel sequence per device)."""
        by_device: Dict[Any, List[torch.Tensor]] = {}
        for t in tensors:
            by_device.setdefault(t.device, []).append(t.reshape(-1))
        for flats in by_device.values():
            self.add(name, torch.cat(flats))

    def flush(self, names: List[str], values: np.ndarray,
              segs: np.ndarray) -> np.ndarray:
        """Counts of ``names`` in their order: the host ``values`` (group
        ``segs`` indexes ``names``) plus what :meth:`add` counted; then
        empty (syncs the devices used).

        Returns:
            np.ndarray: ``(len(names), size)`` float64 counts.
        """
        out = self.buckets.group_bucket_counts(values, segs, len(names))
        index = {name: i for i, name in enumerate(names)}
        with self.lock:
            pending, self.counts = self.counts, {}
        for name, per_device in pending.items():
            if name in index:  # else reset since: dropped with its rows
                for counts in per_device.values():
                    out[index[name]] += counts.cpu().numpy()
        return out


# Counts of values reduced before the flush, shared by every thread's store.
SKETCHES = PendingSketches()
