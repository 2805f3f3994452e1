# Copyright (c) mmstats contributors. All rights reserved.
"""A NaN/inf seen anywhere, known on every rank one iteration later
(``docs/nonfinite.md``).

With ``ModuleStatsHook(watch_nonfinite=True)`` every iteration is
watched; without :class:`NonfiniteAlarm` the watch is read only at the next
publication, which may be many iterations after the NaN started (the run
goes on computing NaNs meanwhile). The alarm says it at the iteration
after the origin, without a host sync on the iteration itself:

- :meth:`NonfiniteAlarm.ring` at the end of iteration ``k`` takes a 0-d
  device flag (1 where this rank's watched outputs or gradients were
  non-finite in ``k``) and starts its copy to host memory (non-blocking on
  a GPU, a CUDA event recorded after it);
- :meth:`NonfiniteAlarm.fired` at the end of iteration ``k + 1`` waits for
  ``k``'s copy (the device finished ``k`` long ago: no stall), and every
  rank takes the MAX of its flag in one ``all_reduce`` of one number on
  mmstats' gloo host group: every rank gets the same answer from the same
  reduced data, so all of them report (or raise) together.

Cost with the watch on: a few small device ops and one copy per iteration,
one 1-element gloo ``all_reduce`` per iteration on a multi-process run;
nothing with the watch off.

Example:
    >>> import torch
    >>> alarm = NonfiniteAlarm()
    >>> alarm.ring(torch.tensor(0.))  # iteration 1: finite
    >>> alarm.fired()  # nothing rung before iteration 1
    False
    >>> alarm.ring(torch.tensor(1.))  # iteration 2: a NaN
    >>> alarm.fired()  # at the end of iteration 2: iteration 1's flag
    False
    >>> alarm.ring(torch.tensor(0.))  # iteration 3
    >>> alarm.fired()  # iteration 2's flag
    True
"""
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from mmstats.dist import host_group, is_distributed

__all__ = ['NonfiniteAlarm']


class NonfiniteAlarm:
    """Whether some rank flagged the previous iteration, agreed by every
    rank (see the module's docstring).

    Example:
        >>> NonfiniteAlarm().fired()
        False
    """

    def __init__(self) -> None:
        # (host buffer, CUDA event or None): the newest iteration's flag
        # and the one before it, which fired() reads
        self._new: Optional[Tuple[np.ndarray, Optional[object]]] = None
        self._ready: Optional[Tuple[np.ndarray, Optional[object]]] = None
        self._pinned: List[torch.Tensor] = []  # two, used in turn (CUDA)
        self._turn = 0

    def ring(self, flag: Optional[torch.Tensor]) -> None:
        """Take this iteration's 0-d flag (None: nothing watched) and start
        its copy to the host; no sync (on CUDA: into one of two pinned
        buffers, used in turn, the other still holding the flag
        :meth:`fired` reads)."""
        self._ready, self._new = self._new, None
        if flag is None:
            return
        if not flag.is_cuda:  # a copy into numpy's memory: no read
            buffer = np.zeros(1, dtype=np.float32)
            torch.from_numpy(buffer).copy_(flag.detach().reshape(1))
            self._new = (buffer, None)
            return
        if not self._pinned:
            self._pinned = [
                torch.zeros(1, dtype=torch.float32).pin_memory()
                for _ in range(2)
            ]
        self._turn ^= 1
        host = self._pinned[self._turn]
        host.copy_(flag.detach().reshape(1), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._new = (host.numpy(), event)

    def fired(self) -> bool:
        """Whether some rank flagged the iteration before the newest
        :meth:`ring`. All ranks must call it together, once per
        iteration (one ``all_reduce`` of one number on a multi-process
        run)."""
        value = np.zeros(1, dtype=np.float32)
        if self._ready is not None:
            buffer, event = self._ready
            if event is not None:
                event.synchronize()  # the previous iteration's copy
            value[0] = buffer[0]
            self._ready = None
        if is_distributed():
            agreed = torch.from_numpy(value)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=host_group())
        return bool(value[0] > 0)
