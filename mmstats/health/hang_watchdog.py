# Copyright (c) mmstats contributors. All rights reserved.
"""The hang watch's thread (``docs/hangs.md``): one per rank, it writes
the rank's progress to the process group's store (at most every
``interval`` seconds, only when it changed), and on rank 0 reads every
rank's, finds a stall (:func:`~.hangs.find_stall`), logs the ERROR line
and posts a verdict that the stalled ranks answer with their Python stacks
and, with ``on_hang='exit'``, every rank with its exit.

The thread never calls a collective: a rank's main thread may be blocked
in one (gloo and NCCL release the GIL while they wait), and the store is
served by its own thread (torch's ``TCPStore``), so a rank whose main
thread hangs, rank 0 included, still writes, reads and reports.
"""
import faulthandler
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, Optional, Union

from mmengine.dist import broadcast_object_list
from mmengine.logging import MMLogger, print_log

from mmstats.utils.torch_compat import default_store, store_has_key
from .hangs import (HANG_EXIT_CODE, HangConfig, Progress, RankRecord, Stall,
                    dump_path, find_stall, hang_message)

__all__ = ['HangWatchdog', 'StoreChannel', 'LocalChannel', 'build_channel']


class StoreChannel:
    """Records and the verdict as keys of a ``torch.distributed`` store,
    under ``prefix`` (one per run): ``<prefix>/rank<r>`` (a
    :class:`~.hangs.RankRecord`), ``<prefix>/verdict`` (rank 0's) and
    ``<prefix>/exited`` (a counter). A key is read only once it exists
    (``store.get`` would wait for it).

    Example:
        >>> from datetime import timedelta
        >>> import torch.distributed as dist
        >>> store = dist.HashStore()
        >>> store.set_timeout(timedelta(seconds=1))
        >>> channel = StoreChannel(store, 'run', world_size=2)
        >>> channel.write(1, 'record of rank 1')
        >>> channel.read_all(), channel.verdict()
        ({1: 'record of rank 1'}, None)
    """

    def __init__(self, store: Any, prefix: str, world_size: int) -> None:
        self.store = store
        self.prefix = prefix
        self.world_size = world_size
        self._present: list = []  # ranks whose record exists

    def _key(self, name: str) -> str:
        return f'{self.prefix}/{name}'

    def write(self, rank: int, text: str) -> None:
        """Set this rank's record."""
        self.store.set(self._key(f'rank{rank}'), text)

    def read_all(self) -> Dict[int, str]:
        """Every record written so far: one round trip for the known ones
        (``multi_get`` where the store has it), one check per missing
        one."""
        known = set(self._present)
        for rank in range(self.world_size):
            key = self._key(f'rank{rank}')
            if rank not in known and store_has_key(self.store, key):
                self._present.append(rank)
        keys = [self._key(f'rank{r}') for r in self._present]
        if not keys:
            return {}
        multi_get = getattr(self.store, 'multi_get', None)
        values = (
            multi_get(keys)
            if multi_get is not None else [self.store.get(k) for k in keys])
        return {r: v.decode() for r, v in zip(self._present, values)}

    def set_verdict(self, text: str) -> None:
        """Rank 0's verdict, for every rank to read."""
        self.store.set(self._key('verdict'), text)

    def verdict(self) -> Optional[str]:
        """The verdict, None before the first."""
        key = self._key('verdict')
        if not store_has_key(self.store, key):
            return None
        return self.store.get(key).decode()

    def mark_exited(self) -> int:
        """Count this rank among those exiting; the count."""
        return self.store.add(self._key('exited'), 1)

    def exited(self) -> int:
        """How many ranks said they exit."""
        return self.store.add(self._key('exited'), 0)


class LocalChannel:
    """The channel of a run without a process group (one rank).

    Example:
        >>> channel = LocalChannel()
        >>> channel.write(0, 'record')
        >>> channel.read_all()
        {0: 'record'}
    """

    def __init__(self) -> None:
        self.keys: Dict[str, str] = {}
        self.world_size = 1

    def write(self, rank: int, text: str) -> None:
        self.keys[f'rank{rank}'] = text

    def read_all(self) -> Dict[int, str]:
        return {0: self.keys['rank0']} if 'rank0' in self.keys else {}

    def set_verdict(self, text: str) -> None:
        self.keys['verdict'] = text

    def verdict(self) -> Optional[str]:
        return self.keys.get('verdict')

    def mark_exited(self) -> int:
        return 1

    def exited(self) -> int:
        return 0


def build_channel(world_size: int
                  ) -> Union[None, 'StoreChannel', 'LocalChannel']:
    """A :class:`StoreChannel` over the default process group's store, a
    :class:`LocalChannel` for one process, None where ranks have no store
    to meet in. Every rank must call it (from its main thread): the keys'
    prefix is rank 0's random name, broadcast (one small collective, once
    a run), so runs in one process group never read each other's keys.

    Example:
        >>> type(build_channel(world_size=1)).__name__
        'LocalChannel'
    """
    if world_size == 1:
        return LocalChannel()
    store = default_store()
    if store is None:
        return None
    name = [uuid.uuid4().hex[:12]]
    broadcast_object_list(name)
    return StoreChannel(store, f'mmstats/hang/{name[0]}', world_size)


def _flush_logs() -> None:
    """Every log handler and the standard streams flushed: ``os._exit``
    skips Python's own shutdown."""
    for ref in list(getattr(logging, '_handlerList', [])):
        handler = ref()
        if handler is not None:
            try:
                handler.flush()
            except Exception:  # a closed stream
                pass
    for stream in (sys.stdout, sys.stderr):
        stream.flush()


class HangWatchdog:
    """The hang watch of one rank, on a daemon thread.

    Args:
        config (HangConfig): Timeouts and what to do.
        progress (Progress): This rank's progress, which its main thread
            updates.
        channel (StoreChannel or LocalChannel): Where ranks meet.
        rank (int): This rank.
        world_size (int): The ranks.
        work_dir (str): Where the stack files go (``hangs/``).
        exit_fn (callable): Called with :data:`~.hangs.HANG_EXIT_CODE` to
            end the process (the main thread may be blocked in a
            collective). Defaults to ``os._exit``.
        clock (callable): Wall time. Defaults to ``time.time``.

    Example:
        >>> progress = Progress()
        >>> watch = HangWatchdog(HangConfig(timeout=60), progress,
        ...                      LocalChannel(), 0, 1, '/tmp/work')
        >>> watch.tick()  # what the thread does every interval
        >>> watch.stall is None
        True
    """

    def __init__(self,
                 config: HangConfig,
                 progress: Progress,
                 channel: Union['StoreChannel', 'LocalChannel'],
                 rank: int,
                 world_size: int,
                 work_dir: str,
                 exit_fn: Callable[[int], None] = os._exit,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.progress = progress
        self.channel = channel
        self.rank = rank
        self.world_size = world_size
        self.work_dir = work_dir
        self.exit_fn = exit_fn
        self.clock = clock
        self.host = socket.gethostname()
        self.stall: Optional[Stall] = None  # rank 0: the one it reported
        self.number = 0  # rank 0: stalls reported; others: last answered
        self._published: Optional[tuple] = None
        self._candidate: Optional[tuple] = None  # rank 0: the last look's
        self._last_line = 0.
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._failed = False

    def start(self) -> None:
        """Publish this rank's progress once, then watch on a thread."""
        self._publish()
        self._thread = threading.Thread(
            target=self._run, name='mmstats-hang-watch', daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread (the run is over)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.interval + 5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.config.interval):
            try:
                self.tick()
            except Exception as error:  # the store went away: run ending
                if not self._failed and not self._stop.is_set():
                    print_log(
                        f'HangWatchHook: rank {self.rank} stops watching '
                        f'for hangs: {type(error).__name__}: {error}',
                        'current',
                        level=logging.WARNING)
                self._failed = True
                return

    def tick(self) -> None:
        """One look: publish, judge (rank 0), answer the verdict."""
        self._publish()
        if self.rank == 0:
            self._judge(self.clock())
        else:
            self._follow()

    def _publish(self) -> None:
        state = self.progress.state
        if state == self._published:
            return
        iteration, seq, phase, detail, since = state
        timeout = self.config.timeout_of(
            phase, self.progress.longest_of(phase, detail))
        record = RankRecord(self.rank, iteration, seq, phase, detail, since,
                            timeout, self.host, os.getpid())
        self.channel.write(self.rank, record.to_text())
        self._published = state

    def _judge(self, now: float) -> None:
        records = {
            rank: RankRecord.from_text(text)
            for rank, text in self.channel.read_all().items()
        }
        stall = find_stall(records, now)
        seen, self._candidate = self._candidate, stall and stall.key
        if stall is not None and stall.key != seen:
            return  # twice in a row: a record may lag one interval
        if stall is None:
            if self.stall is not None:
                print_log(
                    f'Hang over: rank(s) '
                    f'{[r.rank for r in self.stall.stalled]} moved on',
                    'current',
                    level=logging.WARNING)
            self.stall = None
            return
        new = self.stall is None or stall.key != self.stall.key
        if not new and now - self._last_line < self.config.repeat:
            return
        if new:
            self.number += 1
        self.stall, self._last_line = stall, now
        ranks = [r.rank for r in stall.stalled]
        leave = self.config.on_hang == 'exit'
        self.channel.set_verdict(
            json.dumps(dict(number=self.number, ranks=ranks, exit=leave)))
        if 0 in ranks and new:
            self.dump(self.number)
        MMLogger.get_current_instance().error(
            hang_message(stall, now, self.world_size, self.work_dir,
                         self.number, self.config.on_hang, self.config.repeat))
        if leave:
            self._exit_last()

    def _follow(self) -> None:
        text = self.channel.verdict()
        if text is None:
            return
        verdict = json.loads(text)
        if verdict['number'] != self.number:
            self.number = verdict['number']
            if self.rank in verdict['ranks']:
                self.dump(self.number)
        if verdict['exit']:
            self.channel.mark_exited()
            _flush_logs()
            self.exit_fn(HANG_EXIT_CODE)

    def _exit_last(self) -> None:
        """Rank 0 (it may serve the store) exits once the others said they
        do, or after two intervals and a few seconds."""
        deadline = self.clock() + 2 * self.config.interval + 5
        while (self.channel.exited() < self.world_size - 1
               and self.clock() < deadline):
            time.sleep(min(0.2, self.config.interval))
        _flush_logs()
        self.exit_fn(HANG_EXIT_CODE)

    def dump(self, number: int) -> str:
        """Write every thread's Python stack (``faulthandler``) to the
        stall's file; its path."""
        path = dump_path(self.work_dir, self.rank, number)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        iteration, _, phase, detail, since = self.progress.state
        with open(path, 'w') as f:
            f.write(
                f'rank {self.rank} of {self.world_size}, host '
                f'{self.host}, pid {os.getpid()}: phase {phase} '
                f'{detail} of iteration {iteration} since '
                f'{time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))}'
                '\n')
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        return path
