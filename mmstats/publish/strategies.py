# Copyright (c) mmstats contributors. All rights reserved.
"""The training strategies mmstats' hooks refuse (``docs/sharding.md``).

Every strategy whose numbers were checked (``DDPStrategy``,
``FSDPStrategy``, FSDP2 through ``mmstats.FullyShard``,
``DeepSpeedStrategy``) is accepted; a strategy that could not be run here
is refused at ``before_run`` rather than publishing per-shard or missing
numbers.
"""
from __future__ import annotations
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported at run time only (docs/architecture.md)
    from mmengine.runner import Runner

__all__ = ['refuse_unchecked_strategy']

#: strategy class name -> why it is refused
UNCHECKED = {
    'ColossalAIStrategy':
    'ColossalAI could not be installed or run where mmstats is tested, so '
    'no statistic of a ColossalAI-sharded model was ever checked; use '
    'FSDPStrategy, FSDP2 (mmstats.FullyShard) or DeepSpeedStrategy',
}


def refuse_unchecked_strategy(runner: Runner, owner: str) -> None:
    """Raise ``RuntimeError`` if ``runner`` (a ``FlexibleRunner``) trains
    with a strategy in :data:`UNCHECKED`; all ranks raise together (the
    strategy is the same everywhere).

    Example:
        >>> from types import SimpleNamespace
        >>> refuse_unchecked_strategy(SimpleNamespace(), 'X')  # a Runner
    """
    name = type(getattr(runner, 'strategy', None)).__name__
    if name in UNCHECKED:
        raise RuntimeError(f'{owner}: {name} is not supported: '
                           f'{UNCHECKED[name]}')
