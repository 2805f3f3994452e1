# Copyright (c) mmstats contributors. All rights reserved.
"""The oldest torch and mmengine mmstats runs with, checked at import.

The minimums are the oldest versions the test suite was run with (see
``docs/testing.md``): torch 2.11 (CUDA 13, on a GPU machine; CPU CI runs
2.13) and mmengine 0.10.7. They match ``requirements/runtime.txt`` and the
README's "Supported" line. Some of the torch APIs mmstats calls are much
newer than torch's own 2.0 (``torch.library.register_fake`` and
``torch.serialization.add_safe_globals``: 2.4, ``torch.compiler.is_compiling``:
2.3), so an older torch installed with ``--no-deps`` must fail here, naming
the version it needs, not later with an ``AttributeError`` in a hook.
"""
import re
from typing import Tuple

#: Oldest tested torch (``requirements/runtime.txt``).
MIN_TORCH = '2.11'
#: Oldest tested mmengine (``requirements/runtime.txt``).
MIN_MMENGINE = '0.10.7'


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
        >>> check_version('torch', '2.13.0+cpu', '2.11')  # passes
        >>> try:
        ...     check_version('torch', '2.4.1', '2.11')
        ... except ImportError as e:
        ...     print(str(e).split(':')[0])
        mmstats needs torch >= 2.11 (found 2.4.1)
    """
    have, need = release(found), release(minimum)
    width = max(len(have), len(need))
    if have + (0, ) * (width - len(have)) < need + (0, ) * (width - len(need)):
        raise ImportError(
            f'mmstats needs {package} >= {minimum} (found {found}): the '
            f'oldest version it is tested with. Install it with `pip install '
            f'"{package}>={minimum}"` (or -c requirements/constraints.txt).')


def check_dependencies() -> None:
    """Check the installed torch and mmengine (run when ``mmstats`` is
    imported).

    Example:
        >>> check_dependencies()  # the tested versions: passes
    """
    import mmengine
    import torch
    check_version('torch', torch.__version__, MIN_TORCH)
    check_version('mmengine', mmengine.__version__, MIN_MMENGINE)


check_dependencies()
