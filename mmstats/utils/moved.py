# Copyright (c) mmstats contributors. All rights reserved.
"""Public import paths that moved keep an alias for one release.

An old module path is the new module itself (``sys.modules`` holds the new
module under both names) and an old name of a package resolves to the new
object; either warns once, with a ``FutureWarning`` (shown by Python's
default filters, unlike a ``DeprecationWarning`` raised in a library)
naming the new path and the release that removes the old one. The aliases
are resolved by name (:func:`importlib.import_module`): a floor module that
imports nothing of the layers above it.
"""
import importlib
import warnings
from types import ModuleType
from typing import Any, Callable, Dict, Tuple

# the names mmstats.utils exported before issue 54, in mmstats.launch now
_LAUNCH_NAMES = ('allow_mmengine_checkpoints', 'check_checkpoints',
                 'check_runner_type', 'finish_distributed',
                 'init_cpu_distributed', 'registered_name', 'setup_launcher')

#: old public path -> (new path, the release that removes the old path).
#: Modules map to modules, names to ``module.name``.
MOVED: Dict[str, Tuple[str, str]] = {
    # issue 54: the launcher's code and the mmengine patches left utils/
    'mmstats.utils.launch_setup': ('mmstats.launch.setup', '0.4.0'),
    'mmstats.utils.cpu_dist': ('mmstats.launch.cpu_dist', '0.4.0'),
    'mmstats.utils.checkpoint': ('mmstats.launch.checkpoints', '0.4.0'),
    'mmstats.utils.allow_checkpoints':
    ('mmstats.launch.allow_checkpoints', '0.4.0'),
    'mmstats.utils.step_records': ('mmstats.publish.step_records', '0.4.0'),
    **{
        f'mmstats.utils.{name}': (f'mmstats.launch.{name}', '0.4.0')
        for name in _LAUNCH_NAMES
    },
    # the release before: the launchers' helpers went to mmstats.tools
    'mmstats.utils.build_runner':
    ('mmstats.tools.launcher.build_runner', '0.4.0'),
    'mmstats.utils.enable_config_scope':
    ('mmstats.tools.launcher.enable_config_scope', '0.4.0'),
}


def moved_message(old: str) -> str:
    """What the alias of ``old`` warns.

    Example:
        >>> moved_message('mmstats.utils.cpu_dist')
        'mmstats.utils.cpu_dist is deprecated (removed in mmstats 0.4.0); \
import mmstats.launch.cpu_dist'
    """
    new, removal = MOVED[old]
    return (f'{old} is deprecated (removed in mmstats {removal}); import '
            f'{new}')


def resolve(path: str) -> Any:
    """The module or the module attribute named by the dotted ``path``.

    Example:
        >>> resolve('mmstats.utils.moved.resolve') is resolve
        True
    """
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        module, _, name = path.rpartition('.')
        return getattr(importlib.import_module(module), name)


def alias_module(old: str) -> ModuleType:
    """Make the module ``old`` the module it moved to (called by the old
    module's file, which is then replaced in ``sys.modules``), warning
    once: the import is cached.

    Example:
        .. code-block:: python

            # mmstats/utils/cpu_dist.py
            import sys
            from .moved import alias_module
            sys.modules[__name__] = alias_module(__name__)
    """
    warnings.warn(moved_message(old), FutureWarning, stacklevel=3)
    return resolve(MOVED[old][0])


def alias_getattr(package: str, namespace: dict) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that resolves its moved
    names (warning once: the name is then kept in ``namespace``).

    Example:
        >>> getattr_ = alias_getattr('mmstats.utils', {})
        >>> getattr_('no_such_name')
        Traceback (most recent call last):
        ...
        AttributeError: module 'mmstats.utils' has no attribute 'no_such_name'
    """

    def __getattr__(name: str) -> Any:
        old = f'{package}.{name}'
        if old not in MOVED:
            raise AttributeError(
                f'module {package!r} has no attribute {name!r}')
        warnings.warn(moved_message(old), FutureWarning, stacklevel=2)
        value = resolve(MOVED[old][0])
        namespace[name] = value
        return value

    return __getattr__


__all__ = ['MOVED', 'alias_getattr', 'alias_module', 'moved_message']
