"""Subprocess environments in which ``import deepspeed`` fails, as where
DeepSpeed is not installed (see ``sitecustomize.py`` beside this file)."""
import os
import os.path as osp
from typing import Optional

_HERE = osp.dirname(osp.abspath(__file__))


def env_without_deepspeed(env: Optional[dict] = None) -> dict:
    """``env`` (default: ``os.environ``) with this directory first on
    ``PYTHONPATH``: a Python started with it cannot import DeepSpeed.

    Example:
        >>> env = env_without_deepspeed({'PYTHONPATH': '/repo'})
        >>> env['PYTHONPATH'].endswith(os.pathsep + '/repo')
        True
    """
    env = dict(os.environ if env is None else env)
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (_HERE, env.get('PYTHONPATH')) if p)
    return env
