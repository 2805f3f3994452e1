# Copyright (c) mmstats contributors. All rights reserved.
"""A config prepared for its launcher, on GPUs and on CPU-only machines:
the process-group set-up that ``mmstats.tools`` (``build_runner``) and the
opt-in :mod:`mmstats.launch.cpu_dist` (another package's ``tools/train.py``)
both call, and the checks that refuse a config before any process trains.

mmengine 0.10.7's ``init_dist`` calls ``torch.cuda.set_device`` and its
default wrappers pass ``device_ids=[LOCAL_RANK]`` (DDP) or
``device_id=LOCAL_RANK`` (FSDP): all fail without CUDA. :func:`setup_launcher`
leaves GPU machines to mmengine (NCCL) and, on CPU-only ones, initialises a
gloo process group from the launcher's environment before the runner is
built (the runner then skips its own ``init_dist``) and sets the CPU
arguments of the strategy's wrapper. One process with a sharding strategy
(FSDP, FSDP2, DeepSpeed) gets a process group of one. A config that names a
``strategy`` without ``runner_type`` is refused (:func:`check_runner_type`):
``Runner`` ignores ``strategy`` and would train plain DDP.
:func:`finish_distributed` ends the groups at the end of a script,
:func:`abort_distributed` after an error.
Building the runner is the launchers' (:mod:`mmstats.tools.launcher`).
"""
import gc
import inspect
import os
import subprocess
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union

import torch
import torch.distributed as dist

from mmstats.utils.refusal import LaunchRefused

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
            from mmstats.launch import init_cpu_distributed
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
        raise LaunchRefused(f'launcher must be one of {LAUNCHERS[1:]} to '
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


#: strategies whose model wrapper needs a process group even on one process
#: (DDP's wrapper too: ``python tools/test.py`` with a DDP config)
GROUP_STRATEGIES = ('DDPStrategy', 'FSDPStrategy', 'FSDP2Strategy',
                    'DeepSpeedStrategy')


def _type_name(cfg: dict) -> str:
    """The ``type`` of a config dict as a name (a class gives its name)."""
    kind = cfg.get('type', '')
    return kind if isinstance(kind, str) else getattr(kind, '__name__', '')


def _base_name(type_name: str) -> str:
    """``'mmstats.FullyShard'`` -> ``'FullyShard'`` (scope prefix off)."""
    return type_name.rpartition('.')[2]


def registered_name(cfg: dict) -> str:
    """The ``type`` of a config dict without its scope prefix (a class
    gives its name).

    Example:
        >>> registered_name(dict(type='mmstats.FSDP2Strategy'))
        'FSDP2Strategy'
    """
    return _base_name(_type_name(cfg))


class _Strategy(NamedTuple):
    """The config's ``strategy``, read once: the dict itself (edits reach
    the config), its registered name and its model wrapper's."""
    cfg: Optional[dict]
    name: str
    wrapper_name: str
    shown: Any  # its type as the config writes it (None: no strategy)


def _read_strategy(cfg: 'Union[Config, dict]') -> _Strategy:
    strategy = cfg.get('strategy')
    if not isinstance(strategy, dict):
        return _Strategy(None, '', '', strategy)
    wrapper = strategy.get('model_wrapper')
    return _Strategy(
        strategy, registered_name(strategy),
        registered_name(wrapper) if isinstance(wrapper, dict) else '',
        _type_name(strategy))


def is_flexible_runner(runner_type: Any) -> bool:
    """Whether ``runner_type`` (a config's: a registered name or a class)
    is mmengine's ``FlexibleRunner`` or a subclass of it, the runners that
    build their model through ``cfg.strategy``.

    Example:
        >>> is_flexible_runner('FlexibleRunner'), is_flexible_runner(None)
        (True, False)
    """
    if runner_type is None:
        return False
    from mmengine.registry import RUNNERS
    from mmengine.runner import FlexibleRunner
    runner_cls = RUNNERS.get(runner_type) if isinstance(runner_type,
                                                        str) else runner_type
    return isinstance(runner_cls, type) and issubclass(runner_cls,
                                                       FlexibleRunner)


def check_runner_type(cfg: 'Union[Config, dict]',
                      runner_type: Any = None) -> None:
    """Refuse a config whose ``strategy`` its runner would ignore.

    mmengine's ``Runner`` has no strategies: ``Runner.from_cfg`` drops
    ``strategy`` without a word and trains plain DDP. Only a
    ``FlexibleRunner`` (``runner_type='FlexibleRunner'``) builds one.

    Args:
        cfg (Config | dict): The config.
        runner_type (str | type, optional): The runner that will be built
            from it. Defaults to ``cfg.runner_type``.

    Raises:
        ValueError: ``strategy`` is set and the runner is not a
            FlexibleRunner.

    Example:
        >>> check_runner_type(dict(runner_type='FlexibleRunner',
        ...                        strategy=dict(type='FSDPStrategy')))
        >>> check_runner_type(dict(strategy=dict(type='FSDPStrategy')))
        Traceback (most recent call last):
        ...
        mmstats.utils.refusal.LaunchRefused: the config sets ...
    """
    if runner_type is None:
        runner_type = cfg.get('runner_type')
    _refuse_runner_type(
        _read_strategy(cfg), is_flexible_runner(runner_type), runner_type)


def _refuse_runner_type(read: _Strategy, flexible: bool,
                        runner_type: Any) -> None:
    if read.shown is None or flexible:
        return
    shown = read.shown
    raise LaunchRefused(
        f'the config sets strategy={shown} but runner_type is '
        f'{runner_type!r}: mmengine\'s Runner ignores `strategy` and would '
        "train plain DDP. Add runner_type = 'FlexibleRunner' to the config "
        '(configs/_base_/strategies/ do), or remove `strategy`.')


def _free_port() -> str:
    import socket
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return str(sock.getsockname()[1])


def _one_process_group(cfg: 'Union[Config, dict]') -> None:
    """``launcher='none'`` with a sharding strategy: launch a world of one
    (torchrun's environment for one process on this machine)."""
    for key, value in (('RANK', '0'), ('LOCAL_RANK', '0'), ('WORLD_SIZE', '1'),
                       ('MASTER_ADDR', '127.0.0.1')):
        os.environ.setdefault(key, value)
    if 'MASTER_PORT' not in os.environ:
        os.environ['MASTER_PORT'] = _free_port()
    cfg['launcher'] = 'pytorch'


def _cpu_ddp_wrapper(cfg: 'Union[Config, dict]') -> dict:
    """mmengine's default DDP wrapper (``Runner.wrap_model``), on CPU."""
    return dict(
        type='MMDistributedDataParallel',
        device_ids=None,
        **no_buffer_sync_kwargs(),
        find_unused_parameters=cfg.get('find_unused_parameters', False))


def _cpu_strategy(cfg: 'Union[Config, dict]', read: _Strategy) -> None:
    """Set the CPU arguments of a FlexibleRunner's strategy: DDP's
    ``device_ids=None``, FSDP1's ``device_id='cpu'``; DeepSpeed gets its
    CPU accelerator and a gloo group through ``deepspeed.init_distributed``.
    """
    strategy, name = read.cfg, read.name
    if strategy is None:  # FlexibleRunner's own default under a launcher
        cfg['strategy'] = dict(type='DDPStrategy')
        strategy, name = cfg['strategy'], 'DDPStrategy'  # a Config copies
    if name == 'DDPStrategy':
        wrapper = strategy.get('model_wrapper')
        if wrapper is None:
            strategy['model_wrapper'] = _cpu_ddp_wrapper(cfg)
        elif read.wrapper_name == 'MMDistributedDataParallel':
            wrapper.setdefault('device_ids', None)
    elif name == 'FSDPStrategy':
        # a Config copies what setdefault stores: set, then read back
        strategy.setdefault('model_wrapper',
                            dict(type='MMFullyShardedDataParallel'))
        strategy['model_wrapper'].setdefault('device_id', 'cpu')
    elif name == 'DeepSpeedStrategy':
        os.environ.setdefault('DS_ACCELERATOR', 'cpu')
        deepspeed = _import_deepspeed()
        deepspeed.init_distributed(dist_backend='gloo')  # uses the group


def _import_deepspeed() -> Any:
    """``import deepspeed``, or LaunchRefused saying what to install
    (DeepSpeed raises ValueError at import on a torch it does not
    support)."""
    try:
        import deepspeed
    except Exception as exc:
        raise LaunchRefused(
            'strategy DeepSpeedStrategy needs DeepSpeed, which does not '
            f'import here ({type(exc).__name__}: {str(exc)[:120]}); install '
            "the one for this torch with `pip install 'mmengine-stats"
            "[deepspeed]'` (docs/compat.md)") from exc
    return deepspeed


def _deepspeed_optim_wrapper(cfg: 'Union[Config, dict]',
                             read: _Strategy) -> None:
    """Turn the config's own ``optim_wrapper`` into DeepSpeed's: the type
    becomes ``DeepSpeedOptimWrapper`` (DeepSpeed runs backward and step) and
    ``clip_grad=dict(max_norm=X)`` becomes ``strategy.gradient_clipping``.
    What DeepSpeed cannot take is refused with the setting to use."""
    strategy = read.cfg
    if read.name != 'DeepSpeedStrategy':
        return
    optim = cfg.get('optim_wrapper')
    if not isinstance(optim, dict):
        return
    kind = _base_name(_type_name(optim) or 'OptimWrapper')
    if kind == 'AmpOptimWrapper':
        raise LaunchRefused(
            'optim_wrapper.type=AmpOptimWrapper (or --amp) under '
            "DeepSpeedStrategy: DeepSpeed does its own mixed precision; set "
            'strategy.bf16=dict(enabled=True) or strategy.fp16=dict('
            'enabled=True) in the config instead')
    if kind not in ('OptimWrapper', 'DeepSpeedOptimWrapper'):
        raise LaunchRefused(
            f'optim_wrapper.type={kind} under DeepSpeedStrategy: DeepSpeed '
            "needs type='DeepSpeedOptimWrapper'")
    accumulate = optim.pop('accumulative_counts', 1)
    if accumulate != 1:
        raise LaunchRefused(
            f'optim_wrapper.accumulative_counts={accumulate} under '
            'DeepSpeedStrategy: set strategy.gradient_accumulation_steps='
            f'{accumulate} instead')
    clip = optim.pop('clip_grad', None)
    if clip is not None:
        clip = dict(clip)
        max_norm = clip.pop('max_norm', None)
        if max_norm is None or clip.pop('norm_type', 2) != 2 or clip:
            raise LaunchRefused(
                f'optim_wrapper.clip_grad={clip} under DeepSpeedStrategy: '
                'DeepSpeed clips the L2 norm only; set '
                'strategy.gradient_clipping=MAX_NORM instead')
        strategy.setdefault('gradient_clipping', max_norm)
    optim['type'] = 'DeepSpeedOptimWrapper'


def _is_mmengine_fsdp(strategy: dict) -> bool:
    """``type='FSDPStrategy'`` naming mmengine's class (no ``mmstats.``
    prefix)."""
    kind = strategy.get('type', '')
    if isinstance(kind, str):
        return kind == 'FSDPStrategy'
    return (getattr(kind, '__name__', '') == 'FSDPStrategy'
            and not kind.__module__.startswith('mmstats'))


def check_checkpoints(cfg: 'Union[Config, dict]') -> None:
    """Refuse the strategy configs whose checkpoints cannot be trusted
    (``docs/checkpoints.md``), naming the strategy that saves them whole.

    - ``mmstats.FullyShard`` under mmengine's ``DDPStrategy``: rank 0 would
      save its shard of every weight as the whole weight.
    - ``resume`` under mmengine's ``FSDPStrategy``: mmengine 0.10.7 calls
      ``FSDP.optim_state_dict_to_load`` with torch < 2.1's argument order
      and fails inside torch; ``mmstats.FSDPStrategy`` resumes.

    Raises:
        LaunchRefused: Either of the above.

    Example:
        >>> check_checkpoints(dict(strategy=dict(
        ...     type='mmstats.FSDPStrategy'), resume=True))
        >>> check_checkpoints(dict(strategy=dict(
        ...     type='FSDPStrategy'), resume=True))
        Traceback (most recent call last):
        ...
        mmstats.utils.refusal.LaunchRefused: resume=True (--resume) ...
    """
    _refuse_checkpoints(_read_strategy(cfg), cfg.get('resume'))


def _refuse_checkpoints(read: _Strategy, resume: Any) -> None:
    strategy = read.cfg
    if strategy is None:
        return
    if read.name == 'DDPStrategy' and read.wrapper_name == 'FullyShard':
        raise LaunchRefused(
            "strategy=DDPStrategy with model_wrapper=mmstats.FullyShard: "
            "mmengine's DDPStrategy saves rank 0's shard of every FSDP2 "
            "weight as the whole weight. Use strategy=dict(type='mmstats."
            "FSDP2Strategy', model_wrapper=dict(blocks=...)) "
            '(configs/_base_/strategies/fsdp2.py).')
    if resume and _is_mmengine_fsdp(strategy):
        raise LaunchRefused(
            "resume=True (--resume) under mmengine's FSDPStrategy: "
            'mmengine 0.10.7 cannot load FSDP1 optimizer state with torch '
            f'{torch.__version__} (it passes the arguments of '
            "FSDP.optim_state_dict_to_load in torch < 2.1's order). Use "
            "strategy=dict(type='mmstats.FSDPStrategy', ...) "
            '(configs/_base_/strategies/fsdp.py), which resumes; a '
            "checkpoint of mmengine's FSDPStrategy loads its weights with "
            '--cfg-options load_from=CHECKPOINT resume=False.')


def setup_launcher(cfg: 'Union[Config, dict]',
                   runner_type: Any = None) -> None:
    """Prepare ``cfg`` (an mmengine Config) for its ``cfg.launcher``.

    Without CUDA and with a launcher (``'pytorch'``, ``'slurm'``,
    ``'mpi'``): a gloo process group is created now and
    ``env_cfg.dist_cfg.backend`` is set to ``'gloo'``. Then, for a
    ``Runner``, ``model_wrapper_cfg`` becomes, unless the config sets one,
    mmengine's default DDP wrapper with ``device_ids=None``:
    ``dict(type='MMDistributedDataParallel', device_ids=None,
    forward_sync_buffers=False, find_unused_parameters=cfg.
    find_unused_parameters)`` (see :func:`no_buffer_sync_kwargs` for the
    buffer flag). For a ``FlexibleRunner`` the strategy gets the same DDP
    wrapper (or ``device_ids=None`` in its own), FSDP1's wrapper
    ``device_id='cpu'``, DeepSpeed ``DS_ACCELERATOR=cpu`` and its gloo
    group.

    Whatever the machine: under ``DeepSpeedStrategy`` the config's
    ``optim_wrapper`` becomes a ``DeepSpeedOptimWrapper`` (its
    ``clip_grad.max_norm`` the strategy's ``gradient_clipping``), so that a
    strategy fragment merges into any config; and ``launcher='none'`` with a
    strategy whose wrapper needs a process group (DDP, FSDP1, FSDP2,
    DeepSpeed) becomes a ``'pytorch'`` launch of one process. With CUDA,
    mmengine initialises NCCL itself. Idempotent.

    Args:
        cfg (Config | dict): The training config, with ``launcher`` set.
        runner_type (str | type, optional): The runner that will be built
            from ``cfg`` (``'Runner'``, ``FlexibleRunner``...), when the
            caller knows it (``FlexibleRunner.from_cfg`` called directly).
            Defaults to ``cfg.runner_type``.

    Raises:
        ValueError: An unknown launcher, a ``strategy`` without a
            FlexibleRunner (:func:`check_runner_type`), an optimizer
            wrapper DeepSpeed cannot take, or a strategy whose checkpoints
            cannot be trusted (:func:`check_checkpoints`).

    Example:
        .. code-block:: python

            cfg = Config.fromfile('configs/x.py')
            cfg.launcher = 'pytorch'   # under torchrun, on a CPU machine
            setup_launcher(cfg)         # gloo group, CPU DDP wrapper
            runner = Runner.from_cfg(cfg)
    """
    # the config read once: what follows decides from these
    launcher = cfg.get('launcher', 'none')
    if launcher not in LAUNCHERS:
        raise LaunchRefused(
            f'launcher must be one of {LAUNCHERS}, got {launcher!r}')
    runner_type = runner_type or cfg.get('runner_type')
    flexible = is_flexible_runner(runner_type)
    strategy = _read_strategy(cfg)
    _refuse_runner_type(strategy, flexible, runner_type)
    _refuse_checkpoints(strategy, cfg.get('resume'))
    if flexible and strategy.cfg is not None:
        _deepspeed_optim_wrapper(cfg, strategy)
    if launcher == 'none' and flexible and strategy.name in GROUP_STRATEGIES:
        _one_process_group(cfg)  # a process group of one
        launcher = 'pytorch'
    if launcher == 'none' or torch.cuda.is_available():
        return
    cfg.setdefault('env_cfg', {})  # a Config copies what it stores
    cfg['env_cfg'].setdefault('dist_cfg', {})
    dist_cfg = cfg['env_cfg']['dist_cfg']
    dist_cfg['backend'] = 'gloo'
    init_cpu_distributed(launcher, dist_cfg.get('timeout', 1800))
    if flexible:
        _cpu_strategy(cfg, strategy)
    elif cfg.get('model_wrapper_cfg') is None:
        cfg['model_wrapper_cfg'] = _cpu_ddp_wrapper(cfg)


def finish_distributed() -> None:
    """End a finished run's process groups on every rank: a barrier, then
    ``destroy_process_group()``. Nothing without an initialised group.

    Call it once at the end of a script, on every rank (the barrier is a
    collective), after the Runner is gone (returned from the function that
    built it): the model wrappers hold their process groups (FSDP's), so
    a group outlived ``destroy_process_group`` while the Runner did and was
    destroyed while the interpreter exited, where gloo's worker threads
    can abort the process (``terminate called without an active
    exception``, exit code -6: rank 1 of ``dist_test.sh`` on an FSDP1
    checkpoint, 2 runs of 38; 0 of 30 since). A garbage collection first
    frees a Runner that only reference cycles keep; the barrier lets every
    rank finish its last collective before any rank tears its groups down.

    Example:
        .. code-block:: python

            def main():
                train(cfg)           # builds, trains and drops the Runner
                finish_distributed()  # the last line of tools/train.py
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()  # a dropped Runner's cycles: its groups' last references
    dist.barrier()
    dist.destroy_process_group()


def abort_distributed() -> None:
    """End this rank's process groups after an error, without a collective:
    ``destroy_process_group()`` (no barrier: the other ranks may be waiting
    in another collective, or gone). Their pending gloo operations then
    fail with "Connection closed by peer" instead of waiting until the
    group's timeout. Nothing without an initialised group.

    The launcher's, never a library's: mmstats' ``tools/train.py`` calls it
    when an exception leaves training (:func:`finish_distributed` ends a
    run that finished).

    Example:
        .. code-block:: python

            try:
                train(cfg)
            except BaseException:
                abort_distributed()
                raise
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
