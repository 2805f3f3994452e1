# Copyright (c) mmstats contributors. All rights reserved.
"""Launch mmengine Runners on CPU-only machines (gloo) as well as on GPUs.

mmengine 0.10.7's ``init_dist`` calls ``torch.cuda.set_device`` and its
default DDP wrapper passes ``device_ids=[LOCAL_RANK]``: both fail without
CUDA. :func:`setup_launcher` leaves GPU machines to mmengine (NCCL) and, on
CPU-only ones, initialises a gloo process group from the launcher's
environment before the Runner is built (the Runner then skips its own
``init_dist``) and wraps the model with ``device_ids=None``.
"""
import inspect
import os
import subprocess
from datetime import timedelta
from typing import TYPE_CHECKING, Union

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # imported where used: importing changes nothing
    from mmengine.config import Config

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')


def _env_from_slurm(port: str) -> dict:
    node_list = os.environ['SLURM_NODELIST']
    addr = subprocess.getoutput(
        f'scontrol show hostname {node_list} | head -n1')
    return dict(
        RANK=os.environ['SLURM_PROCID'],
        WORLD_SIZE=os.environ['SLURM_NTASKS'],
        LOCAL_RANK=os.environ.get('SLURM_LOCALID', '0'),
        MASTER_ADDR=os.environ.get('MASTER_ADDR', addr),
        MASTER_PORT=port)


def _env_from_mpi(port: str) -> dict:
    return dict(
        RANK=os.environ['OMPI_COMM_WORLD_RANK'],
        WORLD_SIZE=os.environ['OMPI_COMM_WORLD_SIZE'],
        LOCAL_RANK=os.environ.get('OMPI_COMM_WORLD_LOCAL_RANK', '0'),
        MASTER_ADDR=os.environ.get('MASTER_ADDR', '127.0.0.1'),
        MASTER_PORT=port)


def init_cpu_distributed(launcher: str, timeout_s: int = 1800) -> None:
    """Initialise a gloo process group from the launcher's environment.

    Args:
        launcher (str): ``'pytorch'`` (torchrun's ``RANK``, ``WORLD_SIZE``,
            ``MASTER_ADDR``, ``MASTER_PORT``), ``'slurm'`` (``SLURM_PROCID``,
            ``SLURM_NTASKS``, ``SLURM_NODELIST``; port from ``MASTER_PORT``,
            default 29500) or ``'mpi'`` (Open MPI's ``OMPI_COMM_WORLD_*``).
        timeout_s (int): Collective timeout in seconds. Defaults to 1800.

    Example:
        .. code-block:: python

            # in each process torchrun started on a machine without CUDA
            from mmstats.utils import init_cpu_distributed
            init_cpu_distributed('pytorch')
    """
    if dist.is_initialized():
        return
    port = os.environ.get('MASTER_PORT', '29500')
    if launcher == 'slurm':
        os.environ.update(_env_from_slurm(port))
    elif launcher == 'mpi':
        os.environ.update(_env_from_mpi(port))
    elif launcher != 'pytorch':
        raise ValueError(f'launcher must be one of {LAUNCHERS[1:]} to '
                         f'initialise a process group, got {launcher!r}')
    dist.init_process_group('gloo', timeout=timedelta(seconds=timeout_s))


def no_buffer_sync_kwargs() -> dict:
    """DDP's keyword for "buffers are not broadcast before each forward",
    mmengine's default (``broadcast_buffers=False``), without a warning.

    torch 2.13 deprecates ``broadcast_buffers`` (a ``FutureWarning`` from
    every DDP built with it) for ``forward_sync_buffers``. Both set to False
    leave each rank's buffers (BN running statistics) to that rank during
    training; the one difference is at construction: with
    ``forward_sync_buffers=False`` DDP broadcasts rank 0's buffers once,
    together with the parameters it always broadcasts, so every rank starts
    from the same model. Older torch versions get ``broadcast_buffers``.

    Returns:
        dict: ``{'forward_sync_buffers': False}`` or
        ``{'broadcast_buffers': False}``.

    Example:
        >>> no_buffer_sync_kwargs() in ({'forward_sync_buffers': False},
        ...                             {'broadcast_buffers': False})
        True
    """
    params = inspect.signature(
        torch.nn.parallel.DistributedDataParallel.__init__).parameters
    if 'forward_sync_buffers' in params:
        return dict(forward_sync_buffers=False)
    return dict(broadcast_buffers=False)


def setup_launcher(cfg: 'Union[Config, dict]') -> None:
    """Prepare ``cfg`` (an mmengine Config) for its ``cfg.launcher``.

    With CUDA, or with ``launcher='none'``, nothing changes: mmengine
    initialises NCCL itself. Without CUDA, a gloo process group is created
    now, ``env_cfg.dist_cfg.backend`` is set to ``'gloo'`` and, unless the
    config sets one, ``model_wrapper_cfg`` becomes mmengine's default DDP
    wrapper with ``device_ids=None``: ``dict(type='MMDistributedDataParallel',
    device_ids=None, forward_sync_buffers=False, find_unused_parameters=cfg.
    find_unused_parameters)`` (see :func:`no_buffer_sync_kwargs` for the
    buffer flag). Idempotent.

    Args:
        cfg (Config | dict): The training config, with ``launcher`` set.

    Example:
        .. code-block:: python

            cfg = Config.fromfile('configs/x.py')
            cfg.launcher = 'pytorch'   # under torchrun, on a CPU machine
            setup_launcher(cfg)         # gloo group, CPU DDP wrapper
            runner = Runner.from_cfg(cfg)
    """
    launcher = cfg.get('launcher', 'none')
    if launcher not in LAUNCHERS:
        raise ValueError(
            f'launcher must be one of {LAUNCHERS}, got {launcher!r}')
    if launcher == 'none' or torch.cuda.is_available():
        return
    dist_cfg = cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})
    dist_cfg['backend'] = 'gloo'
    init_cpu_distributed(launcher, dist_cfg.get('timeout', 1800))
    if cfg.get('model_wrapper_cfg') is None:
        # mmengine's own default wrapper (Runner.wrap_model), on CPU
        cfg['model_wrapper_cfg'] = dict(
            type='MMDistributedDataParallel',
            device_ids=None,
            **no_buffer_sync_kwargs(),
            find_unused_parameters=cfg.get('find_unused_parameters', False))


def finish_distributed() -> None:
    """End a finished run's process group on every rank: a barrier, then
    ``destroy_process_group()``. Nothing without an initialised group.

    Call it once at the end of a script, after the Runner is done, on every
    rank (the barrier is a collective). A process that exits with its gloo
    group still alive can abort at interpreter exit (``terminate called
    without an active exception``, exit code -6, seen on a rank of a
    finished 2-process CPU run); the barrier lets every rank finish its
    last collective before any rank tears its group down.

    Example:
        .. code-block:: python

            runner.train()
            finish_distributed()   # the last line of tools/train.py
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    dist.destroy_process_group()
