"""Run a function on N real gloo processes and collect what each rank returns.

``run_distributed(fn, world_size, *args)`` calls ``fn(rank, world_size,
*args)`` on every rank of a real gloo process group and returns what each
rank returned. Spawning a process group costs seconds (every rank imports
torch and mmengine), so the ranks are a **pool**: one set of spawned
processes per world size per pytest session (as torchmetrics' tests do),
with the default process group initialised once; each call sends the
pickled ``(fn, args)`` task to every rank of that pool.

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

Failures fail only their test: a rank that raises gives a
``RuntimeError`` with its traceback, a call that does not finish within
``timeout`` seconds gives a ``TimeoutError``; either way the pool is torn
down (its process group may be out of step) and the next call starts a
fresh one. Each rank gets its own ``PYTHONHASHSEED`` (rank + 1), fixed when
the process starts, so set/dict-ordering bugs cannot hide behind a shared
seed.

Environment: ``MMSTATS_TEST_MAX_RANKS`` (default 16) caps the processes
of all live pools together; the least recently used pools are closed to
make room for a new one.
"""
import atexit
import collections
import gc
import os
import queue as queue_lib
import socket
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Seconds a new pool may take to start (imports + process group).
STARTUP_TIMEOUT = 300
#: Seconds the other ranks get to report once one rank has failed.
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
        from tests.helpers.runner import clear_mmengine_singletons
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


def _worker(rank: int, world_size: int, port: int, parent_pid: int, tasks,
            results) -> None:
    os.environ.update(
        MASTER_ADDR='127.0.0.1',
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size))
    # the parent reaps its daemonic ranks; a task may still start
    # DataLoader workers (multiprocessing forbids it to daemons)
    mp.current_process()._config['daemon'] = False
    torch.set_num_threads(1)
    try:
        dist.init_process_group('gloo', rank=rank, world_size=world_size)
        import mmengine.runner  # noqa: F401  (what most tasks need)

        import mmstats  # noqa: F401
        state = _TaskState()
        results.put((None, rank, True, os.getpid()))
    except BaseException:  # report every failure to the parent
        results.put((None, rank, False, traceback.format_exc()))
        return
    try:
        while True:
            try:
                task = tasks.get(timeout=5)
            except queue_lib.Empty:
                if os.getppid() != parent_pid:  # the parent died
                    return
                continue
            if task is None:  # shutdown
                return
            task_id, fn, args = task
            try:
                state.restore()
                value = fn(rank, world_size, *args)
                state.restore()
                results.put((task_id, rank, True, value))
            except BaseException:  # report every failure to the parent
                results.put((task_id, rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _Pool:
    """``world_size`` spawned gloo ranks waiting for tasks."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.num_tasks = 0
        ctx = mp.get_context('spawn')
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        port = free_port()
        self.procs = [
            ctx.Process(
                target=_worker,
                args=(rank, world_size, port, os.getpid(), self.tasks[rank],
                      self.results),
                daemon=True) for rank in range(world_size)
        ]
        saved_seed = os.environ.get('PYTHONHASHSEED')
        try:
            for rank, proc in enumerate(self.procs):
                os.environ['PYTHONHASHSEED'] = str(rank + 1)  # read at spawn
                proc.start()
        finally:
            if saved_seed is None:
                os.environ.pop('PYTHONHASHSEED', None)
            else:
                os.environ['PYTHONHASHSEED'] = saved_seed
        try:
            self._collect(None, STARTUP_TIMEOUT, 'starting the pool')
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        return all(proc.is_alive() for proc in self.procs)

    def run(self, fn: Callable, args: tuple, timeout: float) -> List[Any]:
        self.num_tasks += 1
        task_id = self.num_tasks
        for tasks in self.tasks:
            tasks.put((task_id, fn, args))
        name = getattr(fn, '__name__', repr(fn))
        return self._collect(task_id, timeout, name)

    def _collect(self, task_id: Optional[int], timeout: float,
                 name: str) -> List[Any]:
        """What each rank answered to ``task_id``, or raise."""
        deadline = time.monotonic() + timeout
        results: Dict[int, Any] = {}
        failures: Dict[int, str] = {}
        while len(results) + len(failures) < self.world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                tid, rank, ok, value = self.results.get(timeout=min(left, 1))
            except queue_lib.Empty:
                if not self.alive() and not failures:
                    dead = [
                        rank for rank, proc in enumerate(self.procs)
                        if not proc.is_alive() and rank not in results
                    ]
                    if dead:
                        failures[dead[0]] = (
                            f'the process died (exit code '
                            f'{self.procs[dead[0]].exitcode})')
                        deadline = min(deadline,
                                       time.monotonic() + FAILURE_GRACE)
                continue
            if tid != task_id:
                continue  # a late answer to an earlier task
            if ok:
                results[rank] = value
            else:
                failures[rank] = value
                # a failed rank may leave the others in a collective
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
        if failures:
            rank = min(failures)
            raise RuntimeError(
                f'rank {rank} failed ({name} on {self.world_size} ranks):\n'
                f'{failures[rank]}')
        if len(results) < self.world_size:
            raise TimeoutError(
                f'{name} on {self.world_size} ranks did not finish in '
                f'{timeout}s (hang?); finished ranks: {sorted(results)}')
        return [results[rank] for rank in range(self.world_size)]

    def close(self) -> None:
        for tasks in self.tasks:
            try:
                tasks.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5
        for proc in self.procs:
            if proc.pid is None:
                continue
            proc.join(timeout=max(0., deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for q in [self.results, *self.tasks]:
            q.close()
            q.cancel_join_thread()


_POOLS: 'collections.OrderedDict[int, _Pool]' = collections.OrderedDict()


def _max_ranks() -> int:
    return int(os.environ.get('MMSTATS_TEST_MAX_RANKS', 16))


def _get_pool(world_size: int) -> _Pool:
    pool = _POOLS.get(world_size)
    if pool is not None and not pool.alive():
        shutdown_pools(world_size)
        pool = None
    if pool is None:
        # least recently used first
        while _POOLS and (sum(_POOLS) + world_size > _max_ranks()):
            shutdown_pools(next(iter(_POOLS)))
        pool = _POOLS[world_size] = _Pool(world_size)
    _POOLS.move_to_end(world_size)
    return pool


def shutdown_pools(world_size: Optional[int] = None) -> None:
    """Stop the pool of ``world_size`` ranks (None: every pool)."""
    sizes = list(_POOLS) if world_size is None else [world_size]
    for size in sizes:
        pool = _POOLS.pop(size, None)
        if pool is not None:
            pool.close()


atexit.register(shutdown_pools)


def pool_pids(world_size: int) -> Optional[List[int]]:
    """The process ids of the live pool of ``world_size`` ranks, or None
    (for the helper's own tests)."""
    pool = _POOLS.get(world_size)
    return None if pool is None else [proc.pid for proc in pool.procs]


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
            of a new pool. Defaults to 120.

    Returns:
        list: what each rank returned, indexed by rank.

    Raises:
        RuntimeError: a rank raised (its traceback is in the message).
        TimeoutError: the ranks did not finish within ``timeout`` seconds.
    """
    pool = _get_pool(world_size)
    try:
        return pool.run(fn, args, timeout)
    except BaseException:  # a failure, a hang, KeyboardInterrupt...
        shutdown_pools(world_size)
        raise
