# Copyright (c) mmstats contributors. All rights reserved.
"""This process's peak memory, in MiB (mmengine's ``memory`` unit):
:class:`MemoryReader`.

On a CUDA device, the peaks of memory allocated to tensors and reserved
by the caching allocator since the last :meth:`MemoryReader.reset`
(``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``, then
``reset_peak_memory_stats``): host reads of the allocator's counters, no
device sync. Elsewhere, the process's peak resident set size
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``): the operating system keeps
one peak for the process's lifetime and nothing resets it, so each reading
is the peak *since the process started*, not since the last reading (it
never falls). Without the ``resource`` module (Windows) nothing is read.
"""
import sys
from typing import Dict, Optional

import torch

__all__ = ['MemoryReader']

MIB = 1024.0 * 1024.0


def _peak_rss_mib() -> Optional[float]:
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    unit = 1.0 if sys.platform == 'darwin' else 1024.0  # bytes or KiB
    return peak * unit / MIB


class MemoryReader:
    """The peak memory figures of this process on ``device``.

    Args:
        device (torch.device): The device the model trains on: CUDA reads
            the allocator's peaks of that device, anything else the
            process's peak resident memory.

    Attributes:
        names (tuple[str]): The figures :meth:`read` returns:
            ``('max_allocated', 'max_reserved')`` on CUDA, ``('max_rss',
            )`` elsewhere.

    Example:
        >>> import torch
        >>> reader = MemoryReader(torch.device('cpu'))
        >>> reader.names
        ('max_rss',)
        >>> reader.read()['max_rss'] > 0  # MiB since the process started
        True
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == 'cuda'
        self.device = device
        self.names = (('max_allocated', 'max_reserved') if self.cuda else
                      ('max_rss', ))

    def read(self) -> Dict[str, Optional[float]]:
        """The peaks in MiB (None where a figure cannot be read)."""
        if self.cuda:
            return dict(
                max_allocated=torch.cuda.max_memory_allocated(self.device) /
                MIB,
                max_reserved=torch.cuda.max_memory_reserved(self.device) / MIB)
        return dict(max_rss=_peak_rss_mib())

    def reset(self) -> None:
        """Start new CUDA peaks from the current use (nothing elsewhere)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
