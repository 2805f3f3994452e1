# Copyright (c) mmstats contributors. All rights reserved.
"""Let another package's ``tools/train.py`` run several CPU processes.

mmpretrain's, mmdet's and mmseg's ``tools/train.py`` build their Runner with
``Runner.from_cfg(cfg)`` after setting ``cfg.launcher``; on a machine without
CUDA, mmengine 0.10.7 then fails in ``init_dist`` (``torch.cuda.set_device``)
and in ``wrap_model`` (``device_ids=[LOCAL_RANK]``). One config line fixes
that without touching their scripts::

    custom_imports = dict(imports=['mmstats.utils.cpu_dist'])

and launch as usual, e.g. ``torchrun --nproc_per_node 2 tools/train.py CFG
--launcher pytorch``. mmengine imports ``custom_imports`` while it loads the
config (``Config.fromfile``), before the script builds the Runner.

What importing does: only in a process started by a launcher (``WORLD_SIZE``
from torchrun, ``SLURM_PROCID`` or ``OMPI_COMM_WORLD_RANK`` in the
environment) on a machine without CUDA, ``Runner.from_cfg`` is wrapped so
that it first calls :func:`mmstats.utils.setup_launcher` on the config. That
does nothing for ``launcher='none'``; otherwise it creates the gloo process
group (the Runner then skips its own ``init_dist``) and sets
``model_wrapper_cfg`` to mmengine's default DDP wrapper with
``device_ids=None``, unless the config has one. Anywhere else (with CUDA, or
without a launcher's environment) importing changes nothing.
"""
import functools
import os

import torch
from mmengine.runner import Runner

from .launcher import setup_launcher

LAUNCHER_ENV = ('WORLD_SIZE', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK')
_MARK = '_mmstats_setup_launcher'


def is_installed() -> bool:
    """Whether ``Runner.from_cfg`` currently calls ``setup_launcher``.

    Example:
        .. code-block:: python

            from mmstats.utils import cpu_dist
            cpu_dist.is_installed()  # True under torchrun on a CPU machine
    """
    return getattr(Runner.from_cfg, _MARK, False)


def install() -> bool:
    """Wrap ``Runner.from_cfg`` when launched without CUDA (idempotent).

    Returns:
        bool: Whether ``Runner.from_cfg`` now calls
        :func:`~mmstats.utils.setup_launcher` first.

    Example:
        >>> # what `custom_imports=dict(imports=['mmstats.utils.cpu_dist'])`
        >>> # does; under `torchrun` on a CPU machine:
        >>> from mmstats.utils import cpu_dist
        >>> cpu_dist.is_installed()  # doctest: +SKIP
        True
    """
    if is_installed():
        return True
    if torch.cuda.is_available() or not any(k in os.environ
                                            for k in LAUNCHER_ENV):
        return False
    original = Runner.__dict__['from_cfg'].__func__

    @functools.wraps(original)
    def from_cfg(cls, cfg):
        setup_launcher(cfg)
        return original(cls, cfg)

    setattr(from_cfg, _MARK, True)
    Runner.from_cfg = classmethod(from_cfg)
    return True


def uninstall() -> None:
    """Restore mmengine's ``Runner.from_cfg`` (for tests).

    Example:
        .. code-block:: python

            from mmstats.utils import cpu_dist
            cpu_dist.uninstall()
            assert not cpu_dist.is_installed()
    """
    if is_installed():
        Runner.from_cfg = classmethod(Runner.from_cfg.__func__.__wrapped__)


install()
