# Copyright (c) mmstats contributors. All rights reserved.
"""What the launchers (``train``, ``test``) share: the OpenMMLab command
line arguments every launcher takes and the loading of the config."""
import argparse
import os
import os.path as osp
from typing import Optional

from mmengine.config import Config, DictAction

from mmstats.utils import enable_config_scope

__all__ = ['add_launch_arguments', 'parse_launch_args', 'load_config']


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
    """``args.config`` read (``mmstats::`` fragments resolve), with the
    launcher, ``--cfg-options`` and the work dir (``--work-dir``, else the
    config's, else ``work_dirs/<config name>``) applied.

    Example:
        .. code-block:: python

            cfg = load_config(parse_launch_args(parser))
    """
    enable_config_scope()  # _base_ = ['mmstats::_base_/strategies/...']
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or osp.join(
        './work_dirs',
        osp.splitext(osp.basename(args.config))[0])
    return cfg
