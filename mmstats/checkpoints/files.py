# Copyright (c) mmstats contributors. All rights reserved.
"""Checkpoints written complete or not at all.

A checkpoint is written under a temporary name (:func:`partial_name`,
``epoch_2.pth.partial``) and renamed into place once every rank has
written its part (:func:`finish_save`): a crash mid-save leaves a
``.partial`` beside the last complete checkpoint, never a half-written
``epoch_2.pth``. A directory (sharded, DeepSpeed) gets :data:`COMPLETE`
written last, before the rename: the files it holds and their sizes, so
a file lost or cut short later is named (:mod:`.damage`).
``last_checkpoint`` is replaced atomically, after the rename; older
checkpoints are removed after that (:func:`remove_checkpoint`).

Example:
    >>> partial_name('epoch_2.pth')
    'epoch_2.pth.partial'
"""
import json
import os
import os.path as osp
import shutil
from typing import Optional

__all__ = [
    'PARTIAL', 'COMPLETE', 'partial_name', 'finish_save', 'write_marker',
    'remove_checkpoint', 'write_last_checkpoint', 'replace_atomically'
]

#: the suffix of a checkpoint being written
PARTIAL = '.partial'
#: the file written last into a complete checkpoint directory
COMPLETE = 'mmstats_complete.json'


def partial_name(filename: str) -> str:
    """The name ``filename`` is written under until it is complete.

    Example:
        >>> partial_name('iter_4.pth')
        'iter_4.pth.partial'
    """
    return filename + PARTIAL


def write_marker(directory: str, world_size: int) -> None:
    """Write :data:`COMPLETE` into ``directory``: every file below it
    (relative path: size in bytes) and the world size that wrote it,
    through a temporary file renamed into place.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> write_marker(d, 2)
        >>> sorted(json.load(open(osp.join(d, COMPLETE))))
        ['files', 'format', 'world_size']
    """
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = osp.join(root, name)
            files[osp.relpath(path, directory)] = osp.getsize(path)
    files.pop(COMPLETE, None)
    record = dict(
        format='mmstats checkpoint', world_size=world_size, files=files)
    replace_atomically(osp.join(directory, COMPLETE), json.dumps(record))


def replace_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through ``path.partial`` (flushed and
    synced) renamed into place: a reader sees the old file or the new one.

    Example:
        >>> import tempfile
        >>> p = osp.join(tempfile.mkdtemp(), 'last_checkpoint')
        >>> replace_atomically(p, 'a'); open(p).read()
        'a'
    """
    tmp = partial_name(path)
    with open(tmp, 'w') as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_last_checkpoint(work_dir: str, checkpoint: str) -> None:
    """mmengine's ``last_checkpoint`` record, replaced atomically.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> write_last_checkpoint(d, 'x/epoch_1.pth')
        >>> open(osp.join(d, 'last_checkpoint')).read()
        'x/epoch_1.pth'
    """
    replace_atomically(osp.join(work_dir, 'last_checkpoint'), checkpoint)


def remove_checkpoint(path: str) -> None:
    """Remove a checkpoint file or directory (and a ``.partial`` of it),
    if there.

    Example:
        >>> remove_checkpoint('/nonexistent/epoch_1.pth')
    """
    for each in (path, partial_name(path)):
        if osp.isdir(each) and not osp.islink(each):
            shutil.rmtree(each)
        elif osp.lexists(each):
            os.remove(each)


def _fsync_file(path: str) -> None:
    with open(path, 'rb') as f:
        os.fsync(f.fileno())


def _sync_tree(path: str) -> None:
    """Flush what was written under ``path`` to the disk."""
    if osp.isdir(path):
        for root, _, names in os.walk(path):
            for name in names:
                _fsync_file(osp.join(root, name))
    else:
        _fsync_file(path)


def publish(partial: str, final: str, world_size: int) -> Optional[str]:
    """Rank 0's part of :func:`finish_save`: the marker into a directory,
    then ``partial`` renamed to ``final`` (a checkpoint already there, e.g.
    the same step saved twice, is replaced). Returns a problem, or None.

    Example:
        >>> publish('/nonexistent/a.pth.partial', '/nonexistent/a.pth', 1)
        'nothing was written to /nonexistent/a.pth.partial'
    """
    if not osp.lexists(partial):
        return f'nothing was written to {partial}'
    _sync_tree(partial)
    if osp.isdir(partial):
        write_marker(partial, world_size)
    if osp.isdir(final) and not osp.islink(final):
        old = final + '.old'
        remove_checkpoint(old)
        os.rename(final, old)
        os.rename(partial, final)
        shutil.rmtree(old)
    else:
        os.replace(partial, final)
    return None


def finish_save(partial: str, final: str) -> None:
    """Make the checkpoint written to ``partial`` the complete ``final``,
    on every rank together (all must call it, after the save returned on
    each): a barrier (every rank's part is written), rank 0 publishes
    (:func:`publish`), a barrier (``final`` exists when any rank returns).
    Without a process group, the publishing alone.

    Args:
        partial (str): Where the save wrote (:func:`partial_name`).
        final (str): The checkpoint's name.

    Raises:
        RuntimeError: On every rank, when rank 0 found nothing written.

    Example:
        .. code-block:: python

            runner.save_checkpoint(out_dir, partial_name('epoch_2.pth'))
            finish_save(osp.join(out_dir, 'epoch_2.pth.partial'),
                        osp.join(out_dir, 'epoch_2.pth'))
    """
    import torch.distributed as dist
    from mmengine.dist import (broadcast_object_list, get_rank, get_world_size,
                               is_distributed)

    from mmstats.dist import host_group
    group = host_group()
    if is_distributed():
        dist.barrier(group=group)
    problem = [None]
    if get_rank() == 0:
        problem = [publish(partial, final, get_world_size())]
    if is_distributed():
        broadcast_object_list(problem, src=0, group=group)
    if problem[0] is not None:
        raise RuntimeError(f'checkpoint {final} not saved: {problem[0]}')
