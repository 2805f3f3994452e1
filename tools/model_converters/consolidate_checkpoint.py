# Copyright (c) mmstats contributors. All rights reserved.
"""Turn a sharded run's checkpoint into one ordinary mmengine checkpoint.

    python tools/model_converters/consolidate_checkpoint.py \\
        work_dirs/fsdp/epoch_2.pth work_dirs/fsdp/epoch_2_full.pth

Reads a sharded directory of ``mmstats.FSDPStrategy`` / ``FSDP2Strategy``
(``torch.distributed.checkpoint``), a DeepSpeed ZeRO 0-3 directory or an
ordinary checkpoint file on one process, without a process group, and
writes ``state_dict`` (full tensors, the model's own names) with the
checkpoint's ``meta``: what ``load_from`` of any config (one GPU, another
strategy) takes for fine-tuning or evaluation. The optimizer state is left
out (``docs/checkpoints.md``).
"""
import argparse
import sys

from mmstats.launch import allow_mmengine_checkpoints
from mmstats.strategies import read_full_checkpoint


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('checkpoint', help='the sharded checkpoint directory')
    parser.add_argument('out', help='the checkpoint file to write')
    args = parser.parse_args(argv)
    from mmengine.runner.checkpoint import save_checkpoint
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


if __name__ == '__main__':
    sys.exit(main() and 0)
