# Copyright (c) mmstats contributors. All rights reserved.
"""Run another package's launcher (its ``tools/train.py``) with the config
scopes mmengine cannot resolve by itself.

mmengine maps a config scope to a distribution (``mmseg::`` to
``mmsegmentation``); the maintained fork installs the same module under
another one (``onedl-mmsegmentation``), so its engine refuses
``_base_ = ['mmseg::...']`` ("mmsegmentation is not installed") before any
hook or ``custom_imports`` runs. This runs the given script unchanged, as
``__main__``, after :func:`mmstats.tools.launcher.enable_config_scope`
(which also adds ``mmstats::``). See ``docs/integrations.md``.

Usage::

    python -m mmstats.tools.with_scopes SCRIPT [ARGS...]
    MMSEG=$(python -c 'import mmseg,os;print(os.path.dirname(mmseg.__file__))')
    torchrun --nproc_per_node 2 -m mmstats.tools.with_scopes \\
        $MMSEG/.mim/tools/train.py CONFIG --launcher pytorch
"""
import runpy
import sys
from typing import List, Optional

from mmstats.tools.launcher import enable_config_scope

__all__ = ['main']


def main(argv: Optional[List[str]] = None) -> None:
    """Run ``argv[0]`` (a script path) as ``__main__`` with ``argv[1:]``
    as its arguments, the scopes resolvable.

    Example:
        >>> import os, tempfile
        >>> from mmengine.config.utils import MODULE2PACKAGE
        >>> script = os.path.join(tempfile.mkdtemp(), 'show.py')
        >>> with open(script, 'w') as f:
        ...     _ = f.write('import sys; print(sys.argv[1:])')
        >>> main([script, 'cfg.py', '--launcher', 'none'])
        ['cfg.py', '--launcher', 'none']
        >>> MODULE2PACKAGE['mmstats']
        'mmstats'
    """
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit('usage: python -m mmstats.tools.with_scopes SCRIPT '
                         '[ARGS...]')
    enable_config_scope()
    saved = sys.argv
    sys.argv = list(argv)
    try:
        runpy.run_path(argv[0], run_name='__main__')
    finally:
        sys.argv = saved


if __name__ == '__main__':
    main()
