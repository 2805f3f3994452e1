# Copyright (c) mmstats contributors. All rights reserved.
"""mmstats' registry: a child of mmengine's root HOOKS registry, scope
``mmstats``.

Configs name mmstats' hooks with the scope prefix, ``type='mmstats.X'``:
mmengine then imports ``mmstats.registry`` by itself and the registry's
``locations`` import :mod:`mmstats.hooks`, so no ``custom_imports`` is
needed and the config's ``default_scope`` stays the user's (``mmpretrain``,
``mmdet``...). Nothing is registered in mmengine's root registries: a user's
own names never collide with ours, and an unprefixed ``type='PreciseBNHook'``
never silently resolves to mmstats' hook (or ours to another package's).

Three registries exist: ``HOOKS``, ``MODEL_WRAPPERS`` (``mmstats.FullyShard``,
FSDP2's sharding) and ``STRATEGIES`` (``mmstats.FSDP2Strategy``,
``mmstats.FSDPStrategy``, ``mmstats.DeepSpeedStrategy``: checkpoints that
hold every rank's shard, for ``FlexibleRunner`` configs).
``default_scope='mmstats'`` is not needed (mmstats has no models or
datasets; under it a Runner warns for every other registry): keep the
config's own scope and use the prefix. See ``docs/architecture.md``.
"""
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import MODEL_WRAPPERS as MMENGINE_MODEL_WRAPPERS
from mmengine.registry import STRATEGIES as MMENGINE_STRATEGIES
from mmengine.registry import Registry

HOOKS = Registry(
    'hook',
    parent=MMENGINE_HOOKS,
    scope='mmstats',
    locations=['mmstats.hooks'])

MODEL_WRAPPERS = Registry(
    'model_wrapper',
    parent=MMENGINE_MODEL_WRAPPERS,
    scope='mmstats',
    locations=['mmstats.wrappers'])

STRATEGIES = Registry(
    'strategy',
    parent=MMENGINE_STRATEGIES,
    scope='mmstats',
    locations=[
        'mmstats.strategies.fsdp', 'mmstats.strategies.fsdp2',
        'mmstats.strategies.deepspeed'
    ])
