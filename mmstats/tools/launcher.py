# Copyright (c) mmstats contributors. All rights reserved.
"""Build mmengine runners from a config, the OpenMMLab way: what
``tools/train.py``, ``tools/test.py`` (``python -m mmstats.tools.train``)
and ``python -m mmstats.tools.with_scopes`` do before they train.

:func:`build_runner` runs ``RUNNERS.build(cfg)`` when the config sets
``runner_type`` (``FlexibleRunner`` with a ``strategy``: DDP, FSDP1, FSDP2
through :class:`mmstats.FullyShard`, DeepSpeed), ``Runner.from_cfg(cfg)``
otherwise, after :func:`mmstats.launch.setup_launcher` (the process group
and the CPU wrappers, which ``mmstats.launch.cpu_dist`` also uses).
:func:`enable_config_scope` lets configs inherit ``mmstats::`` fragments.
"""
import importlib.metadata
import importlib.util
import os
from typing import TYPE_CHECKING, Any

import torch

from mmstats.launch import setup_launcher

if TYPE_CHECKING:  # imported where used: importing changes nothing
    from mmengine.config import Config

__all__ = ['build_runner', 'enable_config_scope', 'use_safe_checkpoints']


def enable_config_scope() -> None:
    """Let configs inherit mmstats' fragments as ``mmstats::PATH``, e.g.
    ``_base_ = ['mmstats::_base_/strategies/fsdp2.py']``, from a clone or
    an installed wheel (``mmstats/.mim/configs``, OpenMMLab's layout).

    mmengine resolves ``pkg::`` only for the packages of its
    ``MODULE2PACKAGE`` table; mmstats' launchers (``tools/train.py``,
    ``python -m mmstats.tools.train``) add ``mmstats`` to it before they
    read the config. Importing mmstats never does (a launcher of another
    package reads its config before anything imports mmstats: there,
    inherit the fragment by its path, ``docs/launching.md``).

    The table maps a scope to a distribution (``mmseg`` to
    ``mmsegmentation``); the maintained fork installs the same module under
    another one (``onedl-mmsegmentation``), and mmengine then refuses
    ``mmseg::`` ("mmsegmentation is not installed"). A scope whose
    distribution is missing but whose module is installed is mapped to the
    module, which mmengine finds by its directory.

    Example:
        >>> from mmengine.config.utils import MODULE2PACKAGE
        >>> enable_config_scope()
        >>> MODULE2PACKAGE['mmstats']
        'mmstats'
    """
    from mmengine.config import utils

    # the import name: mmengine looks a name that is no distribution up
    # with importlib (the package's directory, editable or installed)
    utils.MODULE2PACKAGE.setdefault('mmstats', 'mmstats')
    for scope, distribution in list(utils.MODULE2PACKAGE.items()):
        if scope != distribution and not _distribution_installed(
                distribution) and importlib.util.find_spec(scope) is not None:
            utils.MODULE2PACKAGE[scope] = scope  # e.g. the fork's mmseg


def _distribution_installed(name: str) -> bool:
    """Whether distribution ``name`` is installed (its metadata)."""
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def use_safe_checkpoints(cfg: 'Config') -> None:
    """Put :class:`mmstats.CheckpointHook` (atomic saves, the older
    checkpoint removed after the newer is complete, preemption) in place of
    mmengine's ``CheckpointHook`` in ``default_hooks``, with the same
    arguments. A config that names another checkpoint hook keeps it.

    Example:
        >>> cfg = dict(default_hooks=dict(checkpoint=dict(
        ...     type='CheckpointHook', interval=1)))
        >>> use_safe_checkpoints(cfg)
        >>> cfg['default_hooks']['checkpoint']['type']
        'mmstats.CheckpointHook'
    """
    hooks = cfg.get('default_hooks') or {}
    checkpoint = hooks.get('checkpoint')
    if not isinstance(checkpoint, dict):
        return
    kind = checkpoint.get('type')
    if kind in ('CheckpointHook', 'mmengine.CheckpointHook') or (
            isinstance(kind, type) and kind.__name__ == 'CheckpointHook'
            and kind.__module__.startswith('mmengine')):
        checkpoint['type'] = 'mmstats.CheckpointHook'


def build_runner(cfg: 'Config') -> Any:
    """Build the runner of a config the OpenMMLab way, after
    :func:`setup_launcher`: ``RUNNERS.build(cfg)`` when the config sets
    ``runner_type`` (e.g. ``'FlexibleRunner'`` with a ``strategy``),
    ``Runner.from_cfg(cfg)`` otherwise. Without CUDA it sets
    ``DS_ACCELERATOR=cpu`` (unless set) before mmengine's runner module
    imports DeepSpeed, which would otherwise guess and warn. mmengine's
    ``CheckpointHook`` becomes mmstats' (:func:`use_safe_checkpoints`).

    Args:
        cfg (Config): The config, with ``launcher`` set.

    Returns:
        Runner | FlexibleRunner: The runner.

    Example:
        .. code-block:: python

            cfg = Config.fromfile(
                'projects/digits_demo/configs/strategies/'
                'resnet-mini_fsdp_digits.py')
            cfg.launcher = 'pytorch'    # under torchrun
            runner = build_runner(cfg)  # FlexibleRunner + FSDPStrategy
            runner.train()
    """
    if not torch.cuda.is_available():
        # mmengine imports DeepSpeed (when installed) with its runner: name
        # its accelerator on a CPU machine rather than let it guess and warn
        os.environ.setdefault('DS_ACCELERATOR', 'cpu')
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner  # registers Runner, FlexibleRunner
    setup_launcher(cfg)
    use_safe_checkpoints(cfg)
    if 'runner_type' in cfg:  # OpenMMLab's launchers test the key alone
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)
