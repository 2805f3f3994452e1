# Copyright (c) mmstats contributors. All rights reserved.
"""Let another package's ``tools/train.py`` run several CPU processes.

mmpretrain's, mmdet's and mmseg's ``tools/train.py`` build their runner with
``Runner.from_cfg(cfg)`` (``RUNNERS.build(cfg)``, hence
``FlexibleRunner.from_cfg``, when the config sets ``runner_type``) after
setting ``cfg.launcher``; on a machine without CUDA, mmengine 0.10.7 then
fails in ``init_dist`` (``torch.cuda.set_device``) and in ``wrap_model``
(``device_ids=[LOCAL_RANK]``). One config line fixes that without touching
their scripts::

    custom_imports = dict(imports=['mmstats.launch.cpu_dist'])

and launch as usual, e.g. ``torchrun --nproc_per_node 2 tools/train.py CFG
--launcher pytorch``. mmengine imports ``custom_imports`` while it loads the
config (``Config.fromfile``), before the script builds the Runner.

What importing does: only in a process started by a launcher (``WORLD_SIZE``
from torchrun, ``SLURM_PROCID`` or ``OMPI_COMM_WORLD_RANK`` in the
environment) on a machine without CUDA, ``Runner.from_cfg`` and
``FlexibleRunner.from_cfg`` are wrapped so that they first call
:func:`mmstats.launch.setup_launcher` on the config. That creates the gloo
process group (the runner then skips its own ``init_dist``) and sets the
CPU arguments of the model wrapper: ``model_wrapper_cfg`` for a Runner, the
strategy's wrapper for a FlexibleRunner (DDP, FSDP1, FSDP2, DeepSpeed).
The group it created ends when the script exits (``atexit``: a barrier,
then ``destroy_process_group``), as mmstats' own ``tools/train.py`` ends
it: the package's script returns without doing so.
Anywhere else (with CUDA, or without a launcher's environment) importing
changes nothing.
"""
import atexit
import functools
import os

import torch
import torch.distributed as dist
from mmengine.runner import FlexibleRunner, Runner

from .setup import finish_distributed, setup_launcher

LAUNCHER_ENV = ('WORLD_SIZE', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK')
RUNNER_CLASSES = (Runner, FlexibleRunner)
_MARK = '_mmstats_setup_launcher'


def is_installed() -> bool:
    """Whether ``Runner.from_cfg`` (and ``FlexibleRunner.from_cfg``)
    currently call ``setup_launcher``.

    Example:
        .. code-block:: python

            from mmstats.launch import cpu_dist
            cpu_dist.is_installed()  # True under torchrun on a CPU machine
    """
    return all(getattr(cls.from_cfg, _MARK, False) for cls in RUNNER_CLASSES)


def install() -> bool:
    """Wrap ``Runner.from_cfg`` and ``FlexibleRunner.from_cfg`` when
    launched without CUDA (idempotent).

    Returns:
        bool: Whether the runners' ``from_cfg`` now call
        :func:`~mmstats.launch.setup_launcher` first.

    Example:
        >>> # what `custom_imports=dict(imports=['mmstats.launch.cpu_dist'])`
        >>> # does; under `torchrun` on a CPU machine:
        >>> from mmstats.launch import cpu_dist
        >>> cpu_dist.is_installed()  # doctest: +SKIP
        True
    """
    if is_installed():
        return True
    if torch.cuda.is_available() or not any(k in os.environ
                                            for k in LAUNCHER_ENV):
        return False
    for runner_cls in RUNNER_CLASSES:
        if not getattr(runner_cls.from_cfg, _MARK, False):
            runner_cls.from_cfg = classmethod(
                _calling_setup_launcher(
                    runner_cls.__dict__['from_cfg'].__func__))
    return True


def _calling_setup_launcher(original):

    @functools.wraps(original)
    def from_cfg(cls, cfg):
        created = not dist.is_initialized()
        setup_launcher(cfg, runner_type=cls)
        if created and dist.is_initialized():
            _finish_at_exit()
        return original(cls, cfg)

    setattr(from_cfg, _MARK, True)
    return from_cfg


def _finish_at_exit() -> None:
    """End the gloo group this module created when the script exits
    (:func:`mmstats.launch.finish_distributed`, once): another package's
    ``tools/train.py`` returns without destroying it, and a group torn
    down by the exiting interpreter can abort a rank (``terminate called
    without an active exception``, exit code -6: rank 1 of a 2-process
    run of such a script, once in three CI runs on torch 2.14.1)."""
    atexit.unregister(finish_distributed)  # once, however often called
    atexit.register(finish_distributed)


def uninstall() -> None:
    """Restore mmengine's ``from_cfg`` of both runners (for tests).

    Example:
        .. code-block:: python

            from mmstats.launch import cpu_dist
            cpu_dist.uninstall()
            assert not cpu_dist.is_installed()
    """
    for runner_cls in RUNNER_CLASSES:
        if getattr(runner_cls.from_cfg, _MARK, False):
            runner_cls.from_cfg = classmethod(
                runner_cls.from_cfg.__func__.__wrapped__)


install()
