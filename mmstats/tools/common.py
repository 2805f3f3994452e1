# Copyright (c) mmstats contributors. All rights reserved.
"""What the launchers (``train``, ``test``) share: the OpenMMLab command
line arguments every launcher takes, the loading of the config, and each
distinct warning shown once per process."""
import argparse
import contextlib
import os
import os.path as osp
import warnings
from typing import Any, Iterator, Optional, Set, Tuple

from mmengine.config import Config, DictAction

from mmstats.tools.launcher import enable_config_scope

__all__ = [
    'add_launch_arguments', 'parse_launch_args', 'load_config',
    'each_warning_once', 'note_exit'
]

#: the file ``dist_train.sh`` / ``dist_test.sh`` read after torchrun ended
EXIT_NOTE = 'MMSTATS_EXIT_NOTE'


def note_exit(status: int, line: str) -> bool:
    """Rank 0 (of the launch, before or without a process group) writes
    ``status`` and ``line`` to the file the environment's
    ``MMSTATS_EXIT_NOTE`` names: ``dist_train.sh`` and ``dist_test.sh`` exit
    with that status and print that line last, after torchrun's own
    summary (whose status is 1 for any failing process). Nothing without
    the variable.

    Returns:
        bool: Whether the line was noted (the script then says it: the
        caller need not).

    Example:
        >>> note_exit(75, 'stopped on SIGTERM')  # no MMSTATS_EXIT_NOTE here
        False
    """
    path = os.environ.get(EXIT_NOTE)
    rank = os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))
    if not path or int(rank) != 0:
        return False
    with open(path, 'w') as f:
        f.write(f'{status} {line}\n')
    return True


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """``--work-dir``, ``--cfg-options``, ``--launcher`` and the
    ``--local-rank`` that ``torch.distributed.launch`` passes.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_launch_arguments(parser)
        >>> parser.parse_args(['--launcher', 'pytorch']).launcher
        'pytorch'
    """
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override settings of the config, key=value (e.g. '
        'train_cfg.max_epochs=3 model.backbone.norm_cfg.type=GN)')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def parse_launch_args(parser: argparse.ArgumentParser,
                      argv: Optional[list] = None) -> argparse.Namespace:
    """Parse ``argv``; ``LOCAL_RANK`` from ``--local-rank`` where the
    launcher did not set it.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_launch_arguments(parser)
        >>> parse_launch_args(parser, []).work_dir is None
        True
    """
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def load_config(args: argparse.Namespace) -> Config:
    """``args.config`` read (``mmstats::`` fragments resolve, without
    the ``pkg_resources`` deprecation warning mmengine's lookup causes),
    with the launcher, ``--cfg-options`` and the work dir (``--work-dir``,
    else the config's, else ``work_dirs/<config name>``) applied.

    Example:
        .. code-block:: python

            cfg = load_config(parse_launch_args(parser))
    """
    enable_config_scope()  # _base_ = ['mmstats::_base_/strategies/...']
    with warnings.catch_warnings():
        # mmengine 0.10.7 resolves ``pkg::`` bases through pkg_resources,
        # whose import warns (setuptools >= 67.5) on every rank: nothing
        # the user can act on (docs/integrations.md)
        warnings.filterwarnings(
            'ignore', 'pkg_resources is deprecated', category=UserWarning)
        cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or osp.join(
        './work_dirs',
        osp.splitext(osp.basename(args.config))[0])
    return cfg


class _ShowOnce:
    """``warnings.showwarning`` that passes each distinct warning (its
    category and message text) on once and drops its repeats."""

    def __init__(self, show: Any) -> None:
        self.show = show
        self.seen: Set[Tuple[type, str]] = set()

    def __call__(self, message: Any, category: type, *args: Any,
                 **kwargs: Any) -> None:
        key = (category, str(message))
        if key not in self.seen:
            self.seen.add(key)
            self.show(message, category, *args, **kwargs)


@contextlib.contextmanager
def each_warning_once() -> Iterator[None]:
    """Show each distinct Python warning (category and message) at most
    once in this process while the launcher runs; the previous
    ``warnings.showwarning`` is restored at the end.

    The filters still decide what is shown (``-W``, ``PYTHONWARNINGS``,
    a library's ``ignore``, ``error``): only the repeats of what they let
    through are dropped, at display time. A ``'once'`` filter would not
    do: it would unhide the DeprecationWarnings Python hides by default,
    and a library's own ``simplefilter('always')`` comes before it.
    Python's ``'default'`` action remembers a warning per module and line
    (torch's ShardedTensor deprecation comes from three lines of FSDP's
    state-dict code), and forgets them all whenever any
    code changes the filters (every ``warnings.catch_warnings()``):
    torch's deprecated collectives, which DeepSpeed calls on every step,
    came back 54 times in a 2-process demo run. Warnings that libraries log
    (DeepSpeed's ``[WARNING]``, mmengine's ``print_log``) are log records,
    not Python warnings, and pass unchanged (docs/launching.md).

    Example:
        >>> shown = []
        >>> with warnings.catch_warnings():  # restores showwarning
        ...     warnings.simplefilter('always')
        ...     warnings.showwarning = lambda msg, *a, **k: shown.append(
        ...         str(msg))
        ...     with each_warning_once():
        ...         for _ in range(3):
        ...             warnings.warn('deprecated', FutureWarning)
        >>> shown
        ['deprecated']
    """
    previous = warnings.showwarning
    once = _ShowOnce(previous)
    warnings.showwarning = once
    try:
        yield
    finally:
        if warnings.showwarning is once:
            warnings.showwarning = previous
