# Copyright (c) mmstats contributors. All rights reserved.
"""A preemption notice, agreed by every rank.

Slurm (``--signal=TERM@N``, ``USR1``), Kubernetes and spot instances send
a signal a grace period before they kill a job, to one process or to all.
:class:`StopRequest` only notes a signal (its handler sets a flag: a
second signal, or one during a save, changes nothing else); :func:`agree`
makes the note every rank's at an iteration boundary, with one
``all_reduce`` MAX of one host integer over mmstats' gloo group
(``mmstats.dist.host_group``: no device sync). The caller then saves a
checkpoint on every rank and raises :class:`Preempted`, whose exit status
is :data:`PREEMPTED_EXIT_CODE`.
"""
import signal
import threading
import time
from typing import Any, Dict, Optional, Sequence, Union

import torch

__all__ = [
    'PREEMPTED_EXIT_CODE', 'Preempted', 'StopRequest', 'agree',
    'signal_numbers'
]

#: the exit status of a preempted run (sysexits' EX_TEMPFAIL: "try again"):
#: a requeue script tests it
PREEMPTED_EXIT_CODE = 75


class Preempted(SystemExit):
    """Training stopped on a signal after its checkpoint was saved: exits
    the process with :data:`PREEMPTED_EXIT_CODE` unless caught.

    Example:
        >>> Preempted('SIGTERM', 'work_dirs/x/iter_7.pth').code
        75
    """

    def __init__(self, signal_name: str, checkpoint: Optional[str]) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.signal_name = signal_name
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        return (f'stopped on {self.signal_name}; checkpoint {self.checkpoint}'
                f' saved; exit status {PREEMPTED_EXIT_CODE}')


def signal_numbers(names: Union[None, str, Sequence[str]]) -> Dict[str, int]:
    """``{'SIGTERM': 15, ...}`` for signal names (``'SIGTERM'``,
    ``'TERM'``); None or ``()`` is none.

    Raises:
        ValueError: An unknown name, or ``SIGKILL``/``SIGSTOP`` (no process
            can handle them).

    Example:
        >>> signal_numbers(['SIGTERM', 'USR1'])
        {'SIGTERM': 15, 'SIGUSR1': 10}
    """
    if names is None:
        return {}
    if isinstance(names, str):
        names = [names]
    out = {}
    for name in names:
        full = name if str(name).startswith('SIG') else f'SIG{name}'
        number = getattr(signal, str(full), None)
        if not isinstance(number, signal.Signals) or full in ('SIGKILL',
                                                              'SIGSTOP'):
            raise ValueError(
                f'stop_signals: {name!r} is not a signal a process can '
                "handle (e.g. 'SIGTERM', 'SIGUSR1'; None switches it off)")
        out[full] = int(number)
    return out


class StopRequest:
    """The signals that ask a run to stop, and whether one came.

    Args:
        signals (Sequence[str]): Signal names. Defaults to
            ``('SIGTERM', 'SIGUSR1')``.

    Example:
        >>> request = StopRequest(['SIGUSR1'])
        >>> request.install()  # in the main thread
        True
        >>> import os; os.kill(os.getpid(), signal.SIGUSR1)
        >>> request.signal_name
        'SIGUSR1'
        >>> request.uninstall()
    """

    def __init__(self,
                 signals: Sequence[str] = ('SIGTERM', 'SIGUSR1')) -> None:
        self.numbers = signal_numbers(signals)
        self.signal_name: Optional[str] = None
        self.received_at: Optional[float] = None
        self.count = 0
        self._previous: Dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a signal came to this process."""
        return self.signal_name is not None

    def install(self) -> bool:
        """Handle the signals (the main thread only: Python's rule); the
        previous handlers are kept for :meth:`uninstall`. Returns whether
        they are installed."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for number in self.numbers.values():
            if number not in self._previous:
                self._previous[number] = signal.signal(number, self._handle)
        return True

    def uninstall(self) -> None:
        """Put the previous handlers back."""
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}

    def _handle(self, number: int, frame: Any) -> None:
        # a flag only: a second signal, or one during a save, is counted
        self.count += 1
        if self.signal_name is None:
            self.signal_name = signal.Signals(number).name
            self.received_at = time.monotonic()


def agree(requested: bool) -> bool:
    """Whether any rank's ``requested`` is True, the same answer on every
    rank (all must call it, at the same iteration): one ``all_reduce`` MAX
    of a host integer over ``mmstats.dist.host_group``. Without a process
    group, ``requested``.

    Example:
        >>> agree(False), agree(True)
        (False, True)
    """
    from mmengine.dist import is_distributed
    if not is_distributed():
        return bool(requested)
    import torch.distributed as dist

    from mmstats.dist import host_group
    flag = torch.tensor([int(requested)], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=host_group())
    return bool(flag[0])


def agree_min(value: int) -> int:
    """The smallest ``value`` of every rank (all must call it): one
    ``all_reduce`` MIN over ``mmstats.dist.host_group``.

    Example:
        >>> agree_min(7)
        7
    """
    from mmengine.dist import is_distributed
    if not is_distributed():
        return int(value)
    import torch.distributed as dist

    from mmstats.dist import host_group
    least = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(least, op=dist.ReduceOp.MIN, group=host_group())
    return int(least[0])
