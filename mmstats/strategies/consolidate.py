# Copyright (c) mmstats contributors. All rights reserved.
"""A sharded run's checkpoint as one ordinary checkpoint, on one process.

What the formats of ``docs/checkpoints.md`` are, and how to read each
without a process group: the sharded directory of
:class:`~mmstats.strategies.FSDPStrategy` / ``FSDP2Strategy``
(``torch.distributed.checkpoint``) and DeepSpeed's. Nothing here imports
DeepSpeed or mmengine's strategies until a function needs them.

``tools/test.py`` evaluates a sharded checkpoint with a config that does
not shard (one process, a plain ``Runner``) through :data:`SCHEME`;
``tools/model_converters/consolidate_checkpoint.py`` writes the file that
``load_from`` takes for fine-tuning (``docs/checkpoints.md``).
"""
import glob
import os.path as osp
import re
import tempfile
from typing import Any

import torch

from mmstats.checkpoints.safe_load import load_checkpoint_file

__all__ = [
    'SCHEME', 'MARKER', 'read_full_checkpoint',
    'register_consolidating_loader', 'is_checkpoint_directory',
    'is_sharded_checkpoint', 'is_deepspeed_checkpoint',
    'consolidate_checkpoint', 'read_deepspeed_checkpoint', 'read_extra'
]

#: mmengine checkpoint-loader prefix: ``consolidate://<directory>``
SCHEME = 'consolidate://'
#: the file that makes a directory an mmstats sharded checkpoint
MARKER = 'mmstats_sharded.json'
#: rank 0's file of the non-tensor parts (meta, message hub, schedulers)
EXTRA = 'extra.pth'


def is_sharded_checkpoint(path: str) -> bool:
    """Whether ``path`` is a directory written in the sharded format.

    Example:
        >>> is_sharded_checkpoint('work_dirs/x/epoch_1.pth')
        False
    """
    return osp.isfile(osp.join(path, MARKER))


def is_deepspeed_checkpoint(path: str) -> bool:
    """Whether ``path`` is a DeepSpeed checkpoint directory.

    Example:
        >>> is_deepspeed_checkpoint('work_dirs/x/epoch_1.pth')
        False
    """
    return osp.isdir(path) and bool(
        glob.glob(osp.join(path, '*model_states.pt')))


def consolidate_checkpoint(path: str) -> dict:
    """Read a sharded checkpoint directory as one full checkpoint dict, on
    one process and without a process group (DCP's own reader).

    Args:
        path (str): The directory (``epoch_N.pth`` of a sharded run).

    Returns:
        dict: ``state_dict`` (full tensors, the model's names),
        ``optimizer``, and the rest (``meta``, ``message_hub``...), as the
        full format holds them.

    Example:
        .. code-block:: python

            ckpt = consolidate_checkpoint('work_dirs/fsdp/epoch_2.pth')
            model.load_state_dict(ckpt['state_dict'])
    """
    from mmstats.utils.torch_compat import dcp_to_torch_save
    if not is_sharded_checkpoint(path):
        raise ValueError(f'{path!r} is not an mmstats sharded checkpoint '
                         f'(no {MARKER} in it)')
    # torch's public converter writes a file: a temporary one beside the
    # checkpoint (where its size fits), read back and removed
    with tempfile.TemporaryDirectory(
            dir=osp.dirname(osp.abspath(path))) as tmp:
        whole = osp.join(tmp, 'tensors.pth')
        dcp_to_torch_save(path, whole)
        tensors = torch.load(whole, map_location='cpu')
    checkpoint = read_extra(path)
    checkpoint.update(tensors)
    return checkpoint


def read_extra(path: str) -> dict:
    """The non-tensor parts of the sharded checkpoint ``path`` (rank 0's
    ``extra.pth``: ``meta``, ``message_hub``, ``param_schedulers``...),
    loaded on the CPU as mmengine's own ``_load_checkpoint`` loads a file:
    with torch's default ``weights_only``, mmengine's objects allowed for
    this read only (:func:`mmstats.checkpoints.safe_load.
    load_checkpoint_file`). The one reader of that file.

    Example:
        .. code-block:: python

            meta = read_extra('work_dirs/fsdp/epoch_2.pth')['meta']
    """
    return load_checkpoint_file(osp.join(path, EXTRA))


def read_deepspeed_checkpoint(path: str) -> dict:
    """A DeepSpeed checkpoint directory (``epoch_N.pth`` of a ZeRO run) as
    one full checkpoint dict, on one process: DeepSpeed's own
    ``zero_to_fp32`` gathers every rank's partitions (fp32 weights and
    buffers); the client state (``meta``, ``message_hub``...) comes from
    the model-states file.

    Example:
        .. code-block:: python

            ckpt = read_deepspeed_checkpoint('work_dirs/zero3/epoch_2.pth')
            model.load_state_dict(ckpt['state_dict'])
    """
    from deepspeed.utils.zero_to_fp32 import \
        get_fp32_state_dict_from_zero_checkpoint
    dirname, tag = osp.split(osp.normpath(path))
    state_dict = get_fp32_state_dict_from_zero_checkpoint(dirname, tag=tag)
    model_states = sorted(glob.glob(osp.join(path, '*model_states.pt')))
    # DeepSpeed's file, read as DeepSpeed's own loader reads it
    # (weights_only=False: it pickles DeepSpeed's config objects)
    client = torch.load(
        model_states[0], map_location='cpu',
        weights_only=False) if model_states else {}
    checkpoint = {
        k: v
        for k, v in client.items()
        if k in ('meta', 'message_hub', 'param_schedulers')
    }
    checkpoint['state_dict'] = dict(state_dict)
    return checkpoint


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
    (``torch.distributed.checkpoint``), a DeepSpeed (ZeRO 0-3) directory or
    an ordinary checkpoint file.

    Args:
        path (str): The checkpoint directory or file.

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
    if osp.isfile(path):  # already whole (DDP's keys lose ``module.``)
        checkpoint = load_checkpoint_file(path)
        checkpoint['state_dict'] = {
            re.sub(r'^module\.', '', k): v
            for k, v in checkpoint['state_dict'].items()
        }
        return checkpoint
    raise ValueError(
        f'{path!r} is neither a checkpoint file, an mmstats sharded '
        'checkpoint (mmstats.FSDPStrategy / FSDP2Strategy) nor a DeepSpeed '
        "one; mmengine's own FSDPStrategy 'local' checkpoints (rank*.pth) "
        'load only under that strategy on as many processes')


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
