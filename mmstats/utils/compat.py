# Copyright (c) mmstats contributors. All rights reserved.
"""The oldest torch and mmengine mmstats runs with, checked at import.

The minimums are the oldest versions the version matrix runs the whole
test suite with (``make test-matrix``, ``docs/compat.md``): torch 2.1 and
mmengine 0.10.7. They match ``requirements/torch.txt``,
``requirements/mminstall.txt`` and the README's "Supported" line. The torch
APIs that changed since 2.1 are reached through
:mod:`mmstats.utils.torch_compat`; a feature with no older API refuses
where it is built, naming the torch it needs.

mmstats does not install either (its ``mminstall`` and ``torch`` extras do,
for a fresh environment): the engine is checked here by its import name,
``mmengine``, whichever distribution provides it: OpenMMLab's ``mmengine``
or the maintained fork ``onedl-mmengine`` (which installs the same import
package). An older torch installed with ``--no-deps`` fails here, naming
the version it needs, not later with an ``AttributeError`` in a hook.
"""
import re
from typing import Tuple

#: Oldest tested torch (``requirements/torch.txt``).
MIN_TORCH = '2.1'
#: Oldest tested mmengine (``requirements/mminstall.txt``).
MIN_MMENGINE = '0.10.7'
#: what to install for each import package, by the distributions that
#: provide it
INSTALL = {
    'torch':
    "`pip install 'torch>={minimum}'` (the build for your CUDA or CPU), or "
    "`pip install 'mmengine-stats[torch]'`",
    'mmengine':
    "`pip install 'mmengine>={minimum},<0.11'` (OpenMMLab's mmengine) or "
    '`pip install onedl-mmengine` (the maintained fork, the same import '
    "package), or `pip install 'mmengine-stats[mminstall]'`",
}


def release(version: str) -> Tuple[int, ...]:
    """The numeric release of a version string: ``'2.11.0+cu130'`` and
    ``'2.11.0a0+git12ab'`` both give ``(2, 11, 0)``.

    Example:
        >>> release('2.11.0+cu130'), release('0.10.7')
        ((2, 11, 0), (0, 10, 7))
    """
    match = re.match(r'\d+(\.\d+)*', str(version))
    if match is None:
        raise ValueError(f'not a version: {version!r}')
    return tuple(int(part) for part in match.group(0).split('.'))


def check_version(package: str, found: str, minimum: str) -> None:
    """Raise ImportError if ``found`` is older than ``minimum``.

    Args:
        package (str): The distribution's name, for the message.
        found (str): The installed version, e.g. ``torch.__version__``.
        minimum (str): The oldest supported version.

    Raises:
        ImportError: ``found`` is older than ``minimum``.

    Example:
        >>> check_version('torch', '2.13.0+cpu', '2.1')  # passes
        >>> try:
        ...     check_version('torch', '2.0.1', '2.1')
        ... except ImportError as e:
        ...     print(str(e).split(':')[0])
        mmstats needs torch >= 2.1 (found 2.0.1)
    """
    have, need = release(found), release(minimum)
    width = max(len(have), len(need))
    if have + (0, ) * (width - len(have)) < need + (0, ) * (width - len(need)):
        by = _by(package)
        raise ImportError(
            f'mmstats needs {package} >= {minimum} (found {found}{by}): the '
            f'oldest version it is tested with. Install it with '
            f'{_install(package, minimum)}.')


def _install(package: str, minimum: str) -> str:
    return INSTALL.get(package, '`pip install "{package}>={minimum}"`').format(
        package=package, minimum=minimum)


def _by(package: str) -> str:
    """`` from onedl-mmengine``: the distribution that installed the
    import package ``package``, where it is not the package's own name."""
    from importlib.metadata import packages_distributions
    names = packages_distributions().get(package, [])
    others = [n for n in names if n.lower() != package]
    return f' from {others[0]}' if others else ''


def import_or_explain(package: str, minimum: str) -> object:
    """``import package``, or an ImportError saying what to install.

    Example:
        >>> import_or_explain('torch', MIN_TORCH).__name__
        'torch'
    """
    import importlib
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as exc:
        if exc.name != package:
            raise
        raise ImportError(
            f'mmstats needs {package} >= {minimum}, which is not installed '
            f'(mmstats never installs it itself): install it with '
            f'{_install(package, minimum)}.') from exc


def check_dependencies() -> None:
    """Check the installed torch and mmengine (run when ``mmstats`` is
    imported).

    Example:
        >>> check_dependencies()  # the tested versions: passes
    """
    torch = import_or_explain('torch', MIN_TORCH)
    check_version('torch', torch.__version__, MIN_TORCH)
    mmengine = import_or_explain('mmengine', MIN_MMENGINE)
    check_version('mmengine', mmengine.__version__, MIN_MMENGINE)


check_dependencies()
