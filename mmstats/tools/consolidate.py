# Copyright (c) mmstats contributors. All rights reserved.
"""Turn a sharded run's checkpoint into one ordinary mmengine checkpoint
(installed as ``mmstats-consolidate``; ``python -m
mmstats.tools.consolidate``; a clone's
``tools/model_converters/consolidate_checkpoint.py`` runs this).

    mmstats-consolidate work_dirs/fsdp/epoch_2.pth \\
        work_dirs/fsdp/epoch_2_full.pth

Reads a sharded directory of ``mmstats.FSDPStrategy`` / ``FSDP2Strategy``
(``torch.distributed.checkpoint``), a DeepSpeed ZeRO 0-3 directory or an
ordinary checkpoint file on one process, without a process group, and
writes ``state_dict`` (full tensors, the model's own names) with the
checkpoint's ``meta``: what ``load_from`` of any config (one GPU, another
strategy) takes for fine-tuning or evaluation. The optimizer state is left
out (``docs/checkpoints.md``). A damaged checkpoint is refused in one line
naming what is wrong, exit status 1.
"""
import argparse
import sys
from typing import Optional

from mmstats.tools.entry import console_main

__all__ = ['main', 'cli']


def main(argv: Optional[list] = None) -> str:
    """Consolidate (see the module's docstring); returns the written path.

    Example:
        .. code-block:: shell

            mmstats-consolidate work_dirs/fsdp/epoch_2.pth full.pth
    """
    parser = argparse.ArgumentParser(
        prog='mmstats-consolidate', description=__doc__.splitlines()[0])
    parser.add_argument('checkpoint', help='the sharded checkpoint directory')
    parser.add_argument('out', help='the checkpoint file to write')
    args = parser.parse_args(argv)
    from mmengine.runner.checkpoint import save_checkpoint

    from mmstats.checkpoints import checkpoint_problem
    from mmstats.launch import LaunchRefused, allow_mmengine_checkpoints
    from mmstats.strategies import read_full_checkpoint
    problem = checkpoint_problem(args.checkpoint)
    if problem is not None:  # damaged: refused before anything reads it
        raise LaunchRefused(f'checkpoint {args.checkpoint} {problem}')
    allow_mmengine_checkpoints()  # torch.load(weights_only=True) of a file
    checkpoint = read_full_checkpoint(args.checkpoint)
    save_checkpoint(
        {
            'state_dict': checkpoint['state_dict'],
            'meta': checkpoint.get('meta', {})
        }, args.out)
    print(f'{args.checkpoint} -> {args.out} '
          f'({len(checkpoint["state_dict"])} tensors)')
    return args.out


def cli(argv: Optional[list] = None) -> int:
    """``mmstats-consolidate``: :func:`main` with its exit status.

    Example:
        .. code-block:: shell

            mmstats-consolidate CKPT_DIR OUT.pth && echo consolidated
    """
    return console_main(main, 'mmstats-consolidate', argv)


if __name__ == '__main__':
    sys.exit(cli())
