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
import mmengine.registry as mmengine_registry
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


def _child(name: str, locations: tuple = ()) -> MMStatsRegistry:
    parent = getattr(mmengine_registry, name)
    return MMStatsRegistry(
        parent.name, parent=parent, scope='mmstats',
        locations=list(locations))


HOOKS = _child('HOOKS', ['mmstats.hooks'])
MODELS = _child('MODELS', ['mmstats.models'])
DATASETS = _child('DATASETS', ['mmstats.datasets'])
TRANSFORMS = _child('TRANSFORMS', ['mmstats.datasets'])
METRICS = _child('METRICS', ['mmstats.evaluation'])
# Children with no modules of ours: a Runner under default_scope='mmstats'
# looks up every registry in this scope and warns where a child is missing.
RUNNERS = _child('RUNNERS')
RUNNER_CONSTRUCTORS = _child('RUNNER_CONSTRUCTORS')
LOOPS = _child('LOOPS')
DATA_SAMPLERS = _child('DATA_SAMPLERS')
MODEL_WRAPPERS = _child('MODEL_WRAPPERS')
WEIGHT_INITIALIZERS = _child('WEIGHT_INITIALIZERS')
OPTIMIZERS = _child('OPTIMIZERS')
OPTIM_WRAPPERS = _child('OPTIM_WRAPPERS')
OPTIM_WRAPPER_CONSTRUCTORS = _child('OPTIM_WRAPPER_CONSTRUCTORS')
PARAM_SCHEDULERS = _child('PARAM_SCHEDULERS')
EVALUATOR = _child('EVALUATOR')
TASK_UTILS = _child('TASK_UTILS')
VISUALIZERS = _child('VISUALIZERS')
VISBACKENDS = _child('VISBACKENDS')
LOG_PROCESSORS = _child('LOG_PROCESSORS')
INFERENCERS = _child('INFERENCERS')
FUNCTIONS = _child('FUNCTIONS')
STRATEGIES = _child('STRATEGIES')
