# Copyright (c) mmstats contributors. All rights reserved.
"""Train a model with an mmengine config (OpenMMLab style).

From a clone:
    One process:   python tools/train.py CONFIG
    N processes:   bash tools/dist_train.sh CONFIG N   (torchrun)
    Slurm:         bash tools/slurm_train.sh PARTITION JOB CONFIG WORK_DIR
From an installed package (``pip install mmengine-stats``):
    One process:   mmstats-train CONFIG   (or python -m mmstats.tools.train)
    N processes:   torchrun --nproc_per_node N -m mmstats.tools.train \
                       CONFIG --launcher pytorch

The runner is built the OpenMMLab way
(``mmstats.tools.launcher.build_runner``): a
config that sets ``runner_type`` (a FlexibleRunner with a DDP, FSDP, FSDP2
or DeepSpeed ``strategy``, e.g. one inheriting
``configs/_base_/strategies/fsdp.py``) gets ``RUNNERS.build(cfg)``, any
other ``Runner.from_cfg(cfg)``. Works on CPU-only machines (gloo) as well as
on GPUs (NCCL).
"""

import argparse
import os
import os.path as osp
import sys
import time
from typing import Any, Optional

import torch
from mmengine.config import Config
from mmengine.dist import is_main_process
from mmengine.hooks import Hook

from mmstats.checkpoints import Preempted, resume_choice
from mmstats.hooks import RandomStateHook
from mmstats.hooks.checkpoint_hook import refuse_loaded_checkpoint
from mmstats.launch import (LaunchRefused, abort_distributed,
                            allow_mmengine_checkpoints, finish_distributed,
                            registered_name)
from mmstats.tools.common import (add_launch_arguments, each_warning_once,
                                  load_config, note_exit, parse_launch_args)
from mmstats.tools.entry import console_main, logged_failure
from mmstats.tools.launcher import build_runner
from mmstats.tools.resume_check import ResumeScheduleCheck

__all__ = ['main', 'cli']


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='train config file path')
    add_launch_arguments(parser)
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from the given checkpoint; without a path, from the '
        'latest checkpoint in the work dir')
    parser.add_argument(
        '--amp',
        action='store_true',
        help='enable automatic mixed precision training (needs CUDA)')
    return parse_launch_args(parser, argv)


def build_config(args: argparse.Namespace) -> Config:
    """Load the config and apply the command line to it."""
    if not osp.isfile(args.config):
        raise FileNotFoundError(
            f'config file {args.config!r} does not exist (the demo configs '
            'are under projects/digits_demo/configs/)')
    cfg = load_config(args)
    if args.amp:
        use_amp(cfg)
    if args.resume == 'auto':
        latest, why = resume_choice(cfg.work_dir)
        cfg.resume = latest is not None
        cfg.load_from = latest
        if why is not None:
            say(f'--resume: {why}')
        elif latest is None:
            say(f'--resume: no checkpoint to resume in {cfg.work_dir}: '
                'training from scratch')
    elif args.resume is not None:
        if not osp.exists(args.resume):  # a sharded one is a directory
            raise FileNotFoundError(
                f'--resume {args.resume!r}: no such checkpoint file (use '
                '--resume without a path for the latest in the work dir)')
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def is_first_process() -> bool:
    """Rank 0 of the launch, before any process group exists."""
    rank = os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))
    return int(rank) == 0


def say(message: str) -> None:
    """One line from the launch (rank 0's), not one per process."""
    if is_first_process():
        print(f'tools/train.py: {message}', file=sys.stderr, flush=True)


def use_amp(cfg: Config) -> None:
    """``--amp``: mmengine's ``AmpOptimWrapper`` with a dynamic loss scale
    (under FSDPStrategy mmengine gives it FSDP's sharded scaler). Refused
    without CUDA, and where the strategy does its own mixed precision."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            '--amp needs a CUDA device (mmengine\'s AmpOptimWrapper); '
            'this machine has none: drop --amp')
    strategy = cfg.get('strategy') or {}
    wrapper = strategy.get('model_wrapper') or {}
    if str(strategy.get('type', '')).endswith('DeepSpeedStrategy'):
        raise ValueError(
            '--amp under DeepSpeedStrategy: DeepSpeed does its own mixed '
            'precision; use --cfg-options strategy.bf16.enabled=True (or '
            'strategy.fp16.enabled=True) instead')
    if str(strategy.get('type', '')).endswith('FSDP2Strategy') or str(
            wrapper.get('type', '')).endswith('FullyShard'):
        raise ValueError(
            '--amp under FSDP2 (FullyShard): its mixed precision is '
            'FullyShard\'s own; use --cfg-options '
            'strategy.model_wrapper.param_dtype=bfloat16 instead')
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')


class FinalMetricsHook(Hook):
    """Keep the metrics of the last validation (the evaluator's own dict,
    without what other hooks put into the message hub)."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.metrics: dict = {}

    def after_val_epoch(self,
                        runner: Any,
                        metrics: Optional[dict] = None) -> None:
        self.metrics = dict(metrics or {})


def plot_curves(work_dir: str) -> str:
    """``curves.png`` of the whole run (every launch of ``work_dir``) and
    how to draw every figure; without matplotlib (the ``demo`` extra), the
    command that draws them once it is installed."""
    command = f'mmstats-plot {work_dir}'
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return (f"not drawn (no matplotlib: pip install 'mmengine-stats"
                f"[demo]', then {command})")
    from mmstats.analysis.plot_curves import plot_training_curves
    path = plot_training_curves(work_dir)
    return f'{path} (every figure: {command})' if path else (
        f'nothing to draw yet ({command})')


def report(runner: Any, metrics: dict) -> None:
    """Print the final validation metrics and where the outputs are."""
    if not is_main_process():
        return
    scalars = osp.join(runner.log_dir, 'vis_data', 'scalars.json')
    lines = ['', '=' * 60]
    numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    if numbers:
        lines.append('final validation: ' +
                     ', '.join(f'{k}={v:.2f}' for k, v in numbers.items()))
    lines += [
        f'logs:        {osp.join(runner.log_dir, runner.timestamp + ".log")}',
        f'scalars:     {scalars}',
        f'checkpoints: {osp.abspath(runner.work_dir)}',
        f'plots:       {plot_curves(osp.abspath(runner.work_dir))}',
        '=' * 60,
    ]
    print('\n'.join(lines), flush=True)


def has_hook(cfg: Config, name: str) -> bool:
    """Whether ``cfg.custom_hooks`` names the hook ``name`` already."""
    return any(
        registered_name(hook) == name
        for hook in cfg.get('custom_hooks') or [])


def train(cfg: Config) -> None:
    """Build the runner of ``cfg``, train, print where the results are.

    The runner gets mmstats' ``RandomStateHook`` (every rank's random
    generators saved with each checkpoint and restored at ``--resume``)
    unless the config has it, and ``ResumeScheduleCheck`` (a resume whose
    schedulers' ``end`` the checkpoint changes back warns once).
    """
    runner = build_runner(cfg)  # RUNNERS.build when runner_type is set
    with logged_failure(runner):  # the reason in the run's .log
        refuse_loaded_checkpoint(cfg)  # damaged: before anything loads it
    final_metrics = FinalMetricsHook()
    runner.register_hook(final_metrics)
    if not has_hook(cfg, 'RandomStateHook'):
        runner.register_hook(RandomStateHook(), priority='LOW')
    runner.register_hook(ResumeScheduleCheck())  # a schedule kept: warned
    with logged_failure(runner):  # the reason in the run's .log
        runner.train()
    report(runner, final_metrics.metrics)


def main(argv: Optional[list] = None) -> None:
    """Train the config named on the command line (``argv``, default
    ``sys.argv[1:]``); ``mmstats-train --help`` lists the arguments.

    Example:
        .. code-block:: shell

            mmstats-train CONFIG --work-dir work_dirs/x
            torchrun --nproc_per_node 2 -m mmstats.tools.train CONFIG \\
                --launcher pytorch
    """
    args = parse_args(argv)
    allow_mmengine_checkpoints()  # --resume under torch.load(weights_only)
    try:
        with each_warning_once():  # per process: torch's, DeepSpeed's...
            cfg = build_config(args)
            train(cfg)
    except LaunchRefused as exc:  # before any process trains: said once
        if not note_exit(1, f'tools/train.py: error: {exc}'):
            say(f'error: {exc}')  # else dist_train.sh says it, last
        if not is_first_process():  # torchrun ends the launch when one
            time.sleep(3)  # process exits: rank 0 says why first
        raise  # for torchrun's Root Cause (cli: exit status 1)
    except Preempted as stop:  # every rank saved: a requeue resumes it
        if not note_exit(stop.code, f'tools/train.py: {stop}'):
            say(str(stop))
        finish_distributed()
        raise  # a SystemExit: cli's exit status 75
    except BaseException:  # the process groups are the launcher's: ended
        abort_distributed()  # here, no rank waits for this one in vain
        raise
    # the runner is gone: its model wrapper's process groups die in
    # finish_distributed, not while the interpreter exits (an abort)
    finish_distributed()


def cli(argv: Optional[list] = None) -> int:
    """``mmstats-train``: :func:`main` with its exit status (0 after a
    run, 1 and one line on failure; ``mmstats.tools.entry``).

    Example:
        .. code-block:: shell

            mmstats-train CONFIG || echo "failed: see the run's .log"
    """
    return console_main(
        main,
        'mmstats-train',
        argv,
        quiet=lambda exc: isinstance(exc, LaunchRefused))


if __name__ == '__main__':
    sys.exit(cli())
