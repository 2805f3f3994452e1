# Copyright (c) mmstats contributors. All rights reserved.
"""Names a package exports but imports on first use (module ``__getattr__``,
PEP 562): importing the package stays cheap and changes nothing."""
import importlib
from typing import Any, Callable, Dict


def lazy_getattr(package: str, where: Dict[str, str],
                 namespace: dict) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name of ``where`` is
    imported from its (relative) module on first use and kept in
    ``namespace`` (the package's ``globals()``).

    Example:
        >>> getattr_ = lazy_getattr('mmstats', {'Collector': '.stats'}, {})
        >>> getattr_('Collector').__name__
        'Collector'
    """

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(
                importlib.import_module(where[name], package), name)
            namespace[name] = value
            return value
        raise AttributeError(f'module {package!r} has no attribute {name!r}')

    return __getattr__
