# Copyright (c) mmstats contributors. All rights reserved.
"""mmstats' registries: children of mmengine's root registries, scope ``mmstats``.

Configs can name mmstats' modules in three ways, all building the same class:

- ``type='mmstats.PreciseBNHook'`` with no import at all: mmengine imports
  ``mmstats.registry`` from the scope prefix, and each registry's
  ``locations`` import the modules that register into it.
- ``custom_imports=dict(imports=['mmstats'])`` with ``type='PreciseBNHook'``
  under ``default_scope='mmstats'``: found in these child registries.
- the same under ``default_scope=None`` (or another scope): mmengine then
  searches its root registries only, so every module registered here is
  also registered in the root under the same name (never replacing a module
  that another package put there first).
"""
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import METRICS as MMENGINE_METRICS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import Registry


class MMStatsRegistry(Registry):
    """A child registry that also registers each module in the root registry.

    So plain ``type='X'`` names resolve under ``default_scope=None`` too.
    """

    def _register_module(self, module, module_name=None, force=False):
        super()._register_module(module, module_name, force)
        root = self._get_root_registry()
        names = [module_name] if isinstance(module_name, str) else (
            module_name or [module.__name__])
        for name in names:
            if name not in root.module_dict:
                root._register_module(module, name)


HOOKS = MMStatsRegistry(
    'hook', parent=MMENGINE_HOOKS, scope='mmstats',
    locations=['mmstats.hooks'])
MODELS = MMStatsRegistry(
    'model', parent=MMENGINE_MODELS, scope='mmstats',
    locations=['mmstats.models'])
DATASETS = MMStatsRegistry(
    'dataset', parent=MMENGINE_DATASETS, scope='mmstats',
    locations=['mmstats.datasets'])
TRANSFORMS = MMStatsRegistry(
    'transform', parent=MMENGINE_TRANSFORMS, scope='mmstats',
    locations=['mmstats.datasets'])
METRICS = MMStatsRegistry(
    'metric', parent=MMENGINE_METRICS, scope='mmstats',
    locations=['mmstats.evaluation'])
