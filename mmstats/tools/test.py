# Copyright (c) mmstats contributors. All rights reserved.
"""Evaluate a checkpoint with an mmengine config (OpenMMLab style).

One process:   python tools/test.py CONFIG CHECKPOINT
               (installed: mmstats-test CONFIG CHECKPOINT, or
               python -m mmstats.tools.test)
N processes:   bash tools/dist_test.sh CONFIG CHECKPOINT N   (torchrun;
               installed: torchrun --nproc_per_node N -m mmstats.tools.test
               CONFIG CHECKPOINT --launcher pytorch)
Runs the runner's ``test()`` on the config's test_dataloader/test_evaluator
and prints the metrics. The runner is built as ``tools/train.py`` builds it
(``mmstats.tools.launcher.build_runner``: a FlexibleRunner with its
``strategy`` when the config sets ``runner_type``); works on CPU-only
machines (gloo) and on GPUs (NCCL).
"""

import argparse
import os.path as osp
import sys
from typing import Optional

from mmengine.config import Config
from mmengine.dist import is_main_process

from mmstats.hooks.checkpoint_hook import refuse_loaded_checkpoint
from mmstats.launch import (LaunchRefused, allow_mmengine_checkpoints,
                            finish_distributed, registered_name)
from mmstats.strategies import (SCHEME, is_checkpoint_directory,
                                register_consolidating_loader)
from mmstats.tools.common import (add_launch_arguments, each_warning_once,
                                  load_config, note_exit, parse_launch_args)
from mmstats.tools.entry import console_main, logged_failure
from mmstats.tools.launcher import build_runner

#: the strategies that load a sharded checkpoint directory themselves
READS_DIRECTORIES = ('FSDPStrategy', 'FSDP2Strategy', 'DeepSpeedStrategy')

__all__ = ['main', 'cli']


def loads_directories(cfg: Config) -> bool:
    """Whether the config's strategy reads a checkpoint directory itself
    (mmstats' sharding strategies and mmengine's FSDP/DeepSpeed ones)."""
    strategy = cfg.get('strategy') if 'runner_type' in cfg else None
    return isinstance(strategy,
                      dict) and registered_name(strategy) in READS_DIRECTORIES


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Evaluate a checkpoint')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='the checkpoint to evaluate')
    add_launch_arguments(parser)
    return parse_launch_args(parser, argv)


def build_config(args: argparse.Namespace) -> Config:
    """Load the config and apply the command line to it."""
    if not osp.isfile(args.config):
        raise FileNotFoundError(f'config file {args.config!r} does not exist')
    if not osp.exists(args.checkpoint):  # a sharded one is a directory
        raise FileNotFoundError(
            f'checkpoint {args.checkpoint!r} does not exist')
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    if is_checkpoint_directory(args.checkpoint) and not loads_directories(cfg):
        # a sharded run's checkpoint, evaluated without sharding: gathered
        # into full tensors in memory, on each process
        register_consolidating_loader()
        cfg.load_from = SCHEME + args.checkpoint
    cfg.resume = False
    return cfg


def test(cfg: Config) -> dict:
    """Build the runner of ``cfg``, test, print the metrics on rank 0."""
    runner = build_runner(cfg)  # RUNNERS.build when runner_type is set
    with logged_failure(runner):  # the reason in the run's .log
        refuse_loaded_checkpoint(cfg)  # damaged: before anything loads it
        metrics = runner.test()
    if is_main_process():
        print(
            'test: ' + ', '.join(f'{k}={v:.4f}' for k, v in metrics.items()
                                 if isinstance(v, (int, float))),
            flush=True)
    return metrics


def main(argv: Optional[list] = None) -> dict:
    """Evaluate a checkpoint (``argv``, default ``sys.argv[1:]``; see
    ``mmstats-test --help``) and return the metrics.

    Example:
        .. code-block:: shell

            mmstats-test CONFIG work_dirs/x/epoch_2.pth
    """
    args = parse_args(argv)
    allow_mmengine_checkpoints()  # torch.load(weights_only=True)
    try:
        with each_warning_once():  # per process: torch's, DeepSpeed's...
            metrics = test(build_config(args))
    except LaunchRefused as exc:  # on every rank together: said once
        line = f'tools/test.py: error: {exc}'
        if not note_exit(1, line) and is_main_process():
            print(line, file=sys.stderr, flush=True)  # else dist_test.sh
        finish_distributed()
        raise  # for torchrun's Root Cause (cli: exit status 1)
    # the runner is gone: its model wrapper's process groups die in
    # finish_distributed, not while the interpreter exits (an abort)
    finish_distributed()
    return metrics


def cli(argv: Optional[list] = None) -> int:
    """``mmstats-test``: :func:`main` with its exit status (0 after the
    evaluation, 1 and one line on failure; ``mmstats.tools.entry``).

    Example:
        .. code-block:: shell

            mmstats-test CONFIG CKPT && echo evaluated
    """
    return console_main(
        main,
        'mmstats-test',
        argv,
        quiet=lambda exc: isinstance(exc, LaunchRefused))


if __name__ == '__main__':
    sys.exit(cli())
