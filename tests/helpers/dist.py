"""Run a function on N real gloo processes and collect what each rank returns.

Worker functions must be defined at module level (they are pickled for
``spawn``) and return plain data (numbers, lists, numpy arrays): torch's
queue shares tensors through the sending process, which exits. Each call
uses a fresh free port; a hang fails the test after ``timeout`` seconds
instead of blocking the suite. Each rank gets its own
``PYTHONHASHSEED`` (rank + 1), so set/dict-ordering bugs cannot hide behind
a shared seed.
"""
import os
import socket
import traceback
from typing import Any, Callable, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple,
            queue) -> None:
    os.environ.update(
        MASTER_ADDR='127.0.0.1',
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    try:
        dist.init_process_group('gloo', rank=rank, world_size=world_size)
        queue.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:  # report every failure to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn: Callable,
                    world_size: int,
                    *args: Any,
                    timeout: float = 120) -> List[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes.

    Returns:
        list: what each rank returned, indexed by rank.

    Raises:
        RuntimeError: a rank raised (its traceback is in the message).
        TimeoutError: the ranks did not finish within ``timeout`` seconds.
    """
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(rank, world_size, port, fn, args, queue),
            daemon=True) for rank in range(world_size)
    ]
    saved_seed = os.environ.get('PYTHONHASHSEED')
    try:
        for rank, proc in enumerate(procs):
            os.environ['PYTHONHASHSEED'] = str(rank + 1)  # read at spawn
            proc.start()
    finally:
        if saved_seed is None:
            os.environ.pop('PYTHONHASHSEED', None)
        else:
            os.environ['PYTHONHASHSEED'] = saved_seed
    results = {}
    try:
        for _ in range(world_size):
            try:
                rank, ok, value = queue.get(timeout=timeout)
            except Exception:  # queue.Empty
                raise TimeoutError(
                    f'{fn.__name__} on {world_size} ranks did not finish in '
                    f'{timeout}s (hang?); finished ranks: {sorted(results)}')
            if not ok:
                raise RuntimeError(f'rank {rank} failed:\n{value}')
            results[rank] = value
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
    return [results[rank] for rank in range(world_size)]
