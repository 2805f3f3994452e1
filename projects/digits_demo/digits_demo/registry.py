# Copyright (c) mmstats contributors. All rights reserved.
"""The demo's registries: children of mmengine's root registries, scope
``digits_demo``. Nothing of the demo is registered in the root registries,
so a user's own ``Accuracy`` or ``ResNetMini`` never collides with it.

Configs select the scope with ``default_scope = 'digits_demo'``; mmengine then
imports ``digits_demo.registry`` and each registry's ``locations``. Children
without modules of ours exist because a Runner looks every registry up in
the default scope and warns where a child is missing.
"""
import mmengine.registry as mmengine_registry
from mmengine.registry import Registry


def _child(name: str, locations: tuple = ()) -> Registry:
    parent = getattr(mmengine_registry, name)
    return Registry(
        parent.name,
        parent=parent,
        scope='digits_demo',
        locations=list(locations))


MODELS = _child('MODELS', ['digits_demo.models'])
DATASETS = _child('DATASETS', ['digits_demo.datasets'])
TRANSFORMS = _child('TRANSFORMS', ['digits_demo.datasets'])
METRICS = _child('METRICS', ['digits_demo.evaluation'])
HOOKS = _child('HOOKS')
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
