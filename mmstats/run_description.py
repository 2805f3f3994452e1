# Copyright (c) mmstats contributors. All rights reserved.
"""What a run is, in one line: the runner, the strategy and its model
wrapper, what is sharded, the world size and the backend.

mmstats' hooks log it once per runner at ``before_train``, when the model
is wrapped (mmengine's ``Runner`` wraps it in ``__init__``,
``FlexibleRunner``'s strategy in ``train()`` before ``before_train``)::

    mmstats: FlexibleRunner, FSDP2 (fully_shard on 5 modules + root), ...
    mmstats: FlexibleRunner, DeepSpeed ZeRO-3, 2 ranks, gloo

Everything is read from the runner's model and ``mmengine.dist``: no
collective, nothing kept in a checkpoint.
"""
import logging
import weakref
from typing import Any, List, Optional

from torch import nn

from mmstats.utils.torch_compat import fsdp_module_class

__all__ = ['describe_run', 'describe_model', 'log_run_description']

#: the runners whose line was logged (weak: a finished runner drops out)
_DESCRIBED: 'weakref.WeakSet' = weakref.WeakSet()


def _plural(count: int, noun: str) -> str:
    return f'{count} {noun}' if count == 1 else f'{count} {noun}s'


def _deepspeed_stage(model: Any) -> Optional[str]:
    """The ZeRO stage of a DeepSpeed engine, or of mmengine's wrapper of
    one (``MMDeepSpeedEngineWrapper.model``); None for anything else. An
    engine without an optimizer evaluates: mmstats' DeepSpeedStrategy
    builds it at stage 0 whatever stage the checkpoint was trained with
    (every rank holds the whole weights), which it says."""
    for candidate in (model, getattr(model, 'model', None)):
        stage = getattr(candidate, 'zero_optimization_stage', None)
        if callable(stage):
            stage = int(stage())
            if stage == 0 and getattr(candidate, 'optimizer', 0) is None:
                return '0, evaluation: whole weights on every rank'
            return str(stage)
    return None


def _fsdp1(modules: List[nn.Module]) -> Optional[str]:
    from torch.distributed.fsdp import (FullyShardedDataParallel,
                                        ShardingStrategy)
    units = [m for m in modules if isinstance(m, FullyShardedDataParallel)]
    if not units:
        return None
    parts = [type(units[0]).__name__, _plural(len(units), 'unit')]
    sharding = getattr(units[0], 'sharding_strategy', None)
    if isinstance(sharding,
                  ShardingStrategy) and (sharding
                                         is not ShardingStrategy.FULL_SHARD):
        parts.append(sharding.name)
    return f'FSDP1 ({", ".join(parts)})'


def _fsdp2(model: nn.Module, modules: List[nn.Module]) -> Optional[str]:
    FSDPModule = fsdp_module_class()
    if FSDPModule is None:  # torch < 2.4
        return None
    units = [m for m in modules if isinstance(m, FSDPModule)]
    if not units:
        return None
    root = isinstance(model, FSDPModule)
    inner = len(units) - root
    what = f'fully_shard on {_plural(inner, "module")}'
    return f'FSDP2 ({what} + root)' if root else f'FSDP2 ({what})'


def describe_model(model: Any) -> Optional[str]:
    """The strategy a wrapped model trains with and what it shards, or
    None for a model that no wrapper holds.

    - DeepSpeed: ``DeepSpeed ZeRO-<stage>`` (the engine's own stage; an
      evaluation's engine, which has no optimizer, is built at stage 0
      whatever the checkpoint's stage: ``DeepSpeed ZeRO-0, evaluation:
      whole weights on every rank``);
    - FSDP1: ``FSDP1 (<outer class>, <N> units)``, every
      ``FullyShardedDataParallel`` instance counted (the root too), and
      the sharding strategy where it is not ``FULL_SHARD``;
    - FSDP2: ``FSDP2 (fully_shard on <N> modules + root)``, the modules
      whose class is an ``FSDPModule`` below the root;
    - DDP: ``DDP (<wrapper class>)``;
    - any other model wrapper (mmengine's ``is_model_wrapper``): its class.

    Args:
        model (Any): ``runner.model``: a module, a model wrapper or
            mmengine's ``MMDeepSpeedEngineWrapper`` (not a module).

    Returns:
        str, optional: The description, or None for a bare module.

    Example:
        >>> from torch import nn
        >>> describe_model(nn.Linear(2, 2)) is None
        True
        >>> describe_model(nn.DataParallel(nn.Linear(2, 2)))
        'DataParallel'
    """
    stage = _deepspeed_stage(model)
    if stage is not None:
        return f'DeepSpeed ZeRO-{stage}'
    if not isinstance(model, nn.Module):
        return type(model).__name__
    modules = list(model.modules())
    found = _fsdp1(modules) or _fsdp2(model, modules)
    if found is not None:
        return found
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return f'DDP ({type(model).__name__})'
    from mmengine.model import is_model_wrapper
    if is_model_wrapper(model) or isinstance(model, nn.DataParallel):
        return type(model).__name__
    return None


def describe_run(runner: Any) -> str:
    """One line saying what ``runner`` trains with: the runner's class, the
    strategy and wrapper with what is sharded (:func:`describe_model`), the
    number of ranks and the backend (``1 process`` without a process
    group). Every rank computes the same line; no collective is called.

    Args:
        runner (Runner): An mmengine ``Runner`` or ``FlexibleRunner``
            whose model is wrapped (at ``before_train`` or later).

    Returns:
        str: e.g. ``'mmstats: Runner, DDP (MMDistributedDataParallel), 2
        ranks, gloo'``.

    Example:
        >>> from torch import nn
        >>> class Runner:  # one process, a bare model
        ...     model = nn.Linear(2, 2)
        >>> describe_run(Runner())
        'mmstats: Runner, 1 process'
    """
    from mmengine.dist import get_backend, get_world_size, is_distributed
    parts = [f'mmstats: {type(runner).__name__}']
    wrapper = describe_model(runner.model)
    if wrapper is not None:
        parts.append(wrapper)
    if is_distributed():
        parts += [_plural(get_world_size(), 'rank'), str(get_backend())]
    else:
        parts.append('1 process')
    return ', '.join(parts)


def log_run_description(runner: Any) -> Optional[str]:
    """Log :func:`describe_run` at INFO through mmengine's current logger
    (rank 0's writes it, as every mmengine line), once per runner however
    many hooks call it; the rank's call after the first returns None.

    Call it where the model is wrapped: ``before_train`` (or
    ``before_val`` / ``before_test`` of a run that does not train).

    Args:
        runner (Runner): The runner whose run starts.

    Returns:
        str, optional: The line logged, or None if it was logged already.

    Example:
        .. code-block:: python

            def before_train(self, runner):
                log_run_description(runner)  # the first hook's call logs
    """
    if runner in _DESCRIBED:
        return None
    line = describe_run(runner)
    _DESCRIBED.add(runner)
    from mmengine.logging import print_log
    print_log(line, logger='current', level=logging.INFO)
    return line
