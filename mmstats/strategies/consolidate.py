# Copyright (c) mmstats contributors. All rights reserved.
"""A sharded run's checkpoint as one ordinary checkpoint, on one process.

``tools/test.py`` evaluates a sharded checkpoint with a config that does
not shard (one process, a plain ``Runner``) through :data:`SCHEME`;
``tools/model_converters/consolidate_checkpoint.py`` writes the file that
``load_from`` takes for fine-tuning (``docs/checkpoints.md``).
"""
import os.path as osp
from typing import Any

from .deepspeed import is_deepspeed_checkpoint, read_deepspeed_checkpoint
from .state_dicts import consolidate_checkpoint, is_sharded_checkpoint

__all__ = [
    'SCHEME', 'read_full_checkpoint', 'register_consolidating_loader',
    'is_checkpoint_directory'
]

#: mmengine checkpoint-loader prefix: ``consolidate://<directory>``
SCHEME = 'consolidate://'


def is_checkpoint_directory(path: str) -> bool:
    """A sharded checkpoint of mmstats' strategies or a DeepSpeed one.

    Example:
        >>> is_checkpoint_directory('work_dirs/x/epoch_1.pth')
        False
    """
    return is_sharded_checkpoint(path) or is_deepspeed_checkpoint(path)


def read_full_checkpoint(path: str) -> dict:
    """The checkpoint at ``path`` with full tensors: a sharded directory of
    ``mmstats.FSDPStrategy`` / ``mmstats.FSDP2Strategy``
    (``torch.distributed.checkpoint``) or a DeepSpeed (ZeRO 0-3) directory.

    Args:
        path (str): The checkpoint directory.

    Returns:
        dict: ``state_dict`` keyed by the model's names, and ``meta``,
        ``message_hub``... where the checkpoint has them.

    Example:
        .. code-block:: python

            ckpt = read_full_checkpoint('work_dirs/zero3/epoch_2.pth')
            model.load_state_dict(ckpt['state_dict'])
    """
    if is_sharded_checkpoint(path):
        return consolidate_checkpoint(path)
    if is_deepspeed_checkpoint(path):
        return read_deepspeed_checkpoint(path)
    kind = 'a directory' if osp.isdir(path) else 'not a directory'
    raise ValueError(
        f'{path!r} is {kind} but neither an mmstats sharded checkpoint '
        '(mmstats.FSDPStrategy / FSDP2Strategy) nor a DeepSpeed one; '
        "mmengine's own FSDPStrategy 'local' checkpoints (rank*.pth) load "
        'only under that strategy on as many processes')


def _load(filename: str, map_location: Any = None) -> dict:
    return read_full_checkpoint(filename[len(SCHEME):])


def register_consolidating_loader() -> None:
    """Let mmengine load ``consolidate://<directory>`` (``load_from``,
    ``Runner.load_checkpoint``) as :func:`read_full_checkpoint` reads it.
    Idempotent; process-wide, so ``tools/test.py`` calls it, not import.

    Example:
        >>> register_consolidating_loader()
    """
    from mmengine.runner.checkpoint import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes=SCHEME, force=True)(_load)
