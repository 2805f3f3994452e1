"""Run a function on N real gloo processes and collect what each rank returns.

``run_distributed(fn, world_size, *args)`` calls ``fn(rank, world_size,
*args)`` on every rank of a real gloo process group and returns what each
rank returned. Spawning a process costs seconds (each imports torch,
mmengine and mmstats), so the ranks are a **pool** kept for the whole
pytest session (as torchmetrics' tests do): process ``r`` serves rank ``r``
of every call. A call on ``world_size`` ranks uses processes ``0 ..
world_size - 1`` (spawning the missing ones); they initialise the default
process group once and keep it until a call with another world size
re-initialises it (milliseconds), so the 2-, 4- and 8-rank tests of a
session share the same 8 processes.

Rules a worker function lives by:

- it is defined at module level (it is pickled by reference) and returns
  plain data (numbers, lists, numpy arrays);
- every rank issues the same collectives (as in real training): a task
  that leaves one rank waiting in a collective hangs, which is reported as
  a ``TimeoutError``.

Isolation between tasks: before and after each task a rank resets
mmstats' reporting state (``mmstats.stats.reporting.reset()``), drops
mmengine's singletons (``clear_mmengine_singletons``), and restores
``os.environ``, the working directory, the warning filters, torch's
default dtype, thread count and seed. The default process group stays.
After the collection of the last task's garbage a rank freezes what lives
on (``gc.freeze()``: the modules, mostly), so the next collection scans
only what the next task made: a full collection of a rank that imported
torch, mmengine and DeepSpeed took 0.5-0.8 s, twice per task.

Failures fail only their test: a rank that raises gives a
``RuntimeError`` with its traceback, a call that does not finish within
``timeout`` seconds a ``TimeoutError``; either way the processes of that
call are stopped (their process group may be out of step) and the next
call spawns fresh ones. Each process has its own ``PYTHONHASHSEED`` (rank
+ 1), fixed when it starts, so set/dict-ordering bugs cannot hide behind a
shared seed.
"""
import atexit
import gc
import os
import socket
import time
import traceback
import warnings
from multiprocessing import connection as mp_connection
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Seconds new processes may take to start (imports).
STARTUP_TIMEOUT = 300
#: Seconds the other ranks get to answer once one rank has failed.
FAILURE_GRACE = 10


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


class _TaskState:
    """The process state a task may change, captured once and restored
    around every task (the default process group is left alone)."""

    def __init__(self) -> None:
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.filters = list(warnings.filters)
        self.seed = torch.initial_seed()
        self.dtype = torch.get_default_dtype()

    def restore(self) -> None:
        from mmstats.stats import reporting
        from tests.helpers.loader_workers import stop_loader_workers
        from tests.helpers.runner import clear_mmengine_singletons
        stop_loader_workers()  # before the collection below (5 s each)
        reporting.reset()
        clear_mmengine_singletons()
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        os.chdir(self.cwd)
        if warnings.filters != self.filters:
            warnings.filters[:] = self.filters
            mutated = getattr(warnings, '_filters_mutated', None)
            if mutated is not None:
                mutated()
        torch.manual_seed(self.seed)
        torch.set_default_dtype(self.dtype)
        torch.set_num_threads(1)
        gc.collect()  # Runners, DataLoader workers of the last task
        gc.freeze()  # what lives on: the next collection skips it


def _join_group(rank: int, world_size: int, port: int) -> None:
    """Make the default process group ``world_size`` ranks on ``port``."""
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.update(
        MASTER_ADDR='127.0.0.1',
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size))
    dist.init_process_group('gloo', rank=rank, world_size=world_size)


def _worker(rank: int, conn) -> None:
    # the parent reaps its daemonic ranks; a task may still start
    # DataLoader workers (multiprocessing forbids it to daemons)
    mp.current_process()._config['daemon'] = False
    torch.set_num_threads(1)
    try:
        if rank < 2:  # what most tasks need (3 and more ranks: rarely)
            import mmengine.runner  # noqa: F401
        import mmstats  # noqa: F401
        import tests.helpers.runner  # noqa: F401
    except BaseException:  # report every failure to the parent
        conn.send((None, False, traceback.format_exc()))
        return
    gc.collect()
    gc.freeze()  # the modules: a full collection takes 0.5-0.8 s without
    conn.send((None, True, os.getpid()))
    group: Optional[Tuple[int, int]] = None
    state = None
    try:
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                return
            if task is None:  # shutdown: no goodbye to a group
                os._exit(0)
            task_id, world_size, port, fn, args = task
            try:
                if group != (world_size, port):
                    group = None
                    _join_group(rank, world_size, port)
                    group = (world_size, port)
                    state = _TaskState()
                state.restore()
                value = fn(rank, world_size, *args)
                state.restore()
                answer = (task_id, True, value)
            except BaseException:  # report every failure to the parent
                answer = (task_id, False, traceback.format_exc())
            try:
                conn.send(answer)
            except Exception:  # an answer that does not pickle
                conn.send((task_id, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _Rank:
    """One spawned process, serving rank ``rank`` of every call, and its
    own pipe: tasks go down, answers come up. A pipe has no lock or feeder
    thread shared between processes, so a rank that exits or is killed
    mid-answer spoils nothing but its own pipe. (With one shared
    ``multiprocessing.Queue``, a rank stopped while its feeder thread held
    the queue's lock left it locked for good: seen once, every later start
    of ranks timed out with no rank started.)"""

    def __init__(self, ctx, rank: int) -> None:
        self.rank = rank
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=_worker, args=(rank, child), daemon=True)
        saved_seed = os.environ.get('PYTHONHASHSEED')
        os.environ['PYTHONHASHSEED'] = str(rank + 1)  # read at spawn
        try:
            self.proc.start()
        finally:
            child.close()
            if saved_seed is None:
                os.environ.pop('PYTHONHASHSEED', None)
            else:
                os.environ['PYTHONHASHSEED'] = saved_seed

    def stop(self, wait: float) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=wait)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.conn.close()


class _Pool:
    """The spawned ranks of the session and the group the first
    ``group[0]`` of them share."""

    def __init__(self) -> None:
        self.ctx = mp.get_context('spawn')
        self.ranks: Dict[int, _Rank] = {}
        self.group: Optional[Tuple[int, int]] = None  # (world_size, port)
        self.num_tasks = 0

    def _ensure(self, world_size: int) -> None:
        """Ranks ``0 .. world_size - 1`` are alive (spawned if needed)."""
        for rank in range(world_size):
            entry = self.ranks.get(rank)
            if entry is not None and not entry.proc.is_alive():
                self.stop(range(rank, rank + 1))
        new = [r for r in range(world_size) if r not in self.ranks]
        for rank in new:
            self.ranks[rank] = _Rank(self.ctx, rank)
        if new:
            self.group = None  # new processes join a new group
            try:
                self._collect(None, new, STARTUP_TIMEOUT, 'starting ranks')
            except BaseException:
                self.stop(new)
                raise

    def run(self, fn: Callable, world_size: int, args: tuple,
            timeout: float) -> List[Any]:
        self._ensure(world_size)
        if self.group is None or self.group[0] != world_size:
            self.group = (world_size, free_port())
        self.num_tasks += 1
        task_id = self.num_tasks
        for rank in range(world_size):
            self.ranks[rank].conn.send(
                (task_id, world_size, self.group[1], fn, args))
        name = getattr(fn, '__name__', repr(fn))
        return self._collect(task_id, list(range(world_size)), timeout,
                             f'{name} on {world_size} ranks')

    def _collect(self, task_id: Optional[int], ranks: List[int],
                 timeout: float, what: str) -> List[Any]:
        """What each of ``ranks`` answered to ``task_id``, or raise."""
        deadline = time.monotonic() + timeout
        results: Dict[int, Any] = {}
        failures: Dict[int, str] = {}
        waiting = {self.ranks[r].conn: r for r in ranks}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for conn in mp_connection.wait(list(waiting), timeout=left):
                rank = waiting[conn]
                try:
                    tid, ok, value = conn.recv()
                except (EOFError, OSError):  # the process died
                    self.ranks[rank].proc.join(timeout=1)
                    tid, ok, value = task_id, False, (
                        'the process died (exit code '
                        f'{self.ranks[rank].proc.exitcode})')
                if tid != task_id:
                    continue  # a late answer to an earlier task
                del waiting[conn]
                if ok:
                    results[rank] = value
                else:
                    failures[rank] = value
                    # a failed rank may leave the others in a collective
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
        for rank in waiting.values():  # hung ranks: killed now
            self.ranks[rank].proc.kill()
        if failures:
            rank = min(failures)
            raise RuntimeError(
                f'rank {rank} failed ({what}):\n{failures[rank]}')
        if len(results) < len(ranks):
            raise TimeoutError(
                f'{what} did not finish in {timeout}s (hang?); finished '
                f'ranks: {sorted(results)}')
        return [results[rank] for rank in ranks]

    def stop(self, ranks=None) -> None:
        """Stop ``ranks`` (None: all); their group is gone."""
        ranks = list(self.ranks) if ranks is None else list(ranks)
        deadline = time.monotonic() + 5
        for rank in ranks:
            entry = self.ranks.pop(rank, None)
            if entry is not None:
                entry.stop(max(0., deadline - time.monotonic()))
        if ranks:
            self.group = None


_POOL: List[_Pool] = []


def shutdown_pools() -> None:
    """Stop every pooled rank (at the end of the session)."""
    while _POOL:
        pool = _POOL.pop()
        pool.stop()


atexit.register(shutdown_pools)


def pool_pids() -> Dict[int, int]:
    """Process id of each live pooled rank (for the helper's own test)."""
    if not _POOL:
        return {}
    return {
        rank: entry.proc.pid
        for rank, entry in _POOL[0].ranks.items() if entry.proc.is_alive()
    }


def run_distributed(fn: Callable,
                    world_size: int,
                    *args: Any,
                    timeout: float = 120) -> List[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes.

    Args:
        fn (Callable): A module-level function (pickled by reference).
        world_size (int): Number of ranks.
        *args: Passed to ``fn`` after ``rank, world_size`` (picklable).
        timeout (float): Seconds the call may take, not counting the start
            of new processes. Defaults to 120.

    Returns:
        list: what each rank returned, indexed by rank.

    Raises:
        RuntimeError: a rank raised (its traceback is in the message).
        TimeoutError: the ranks did not finish within ``timeout`` seconds.
    """
    if not _POOL:
        _POOL.append(_Pool())
    pool = _POOL[0]
    try:
        return pool.run(fn, world_size, args, timeout)
    except BaseException:  # a failure, a hang, KeyboardInterrupt...
        pool.stop(range(world_size))
        raise
