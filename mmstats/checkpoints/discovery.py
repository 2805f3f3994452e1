# Copyright (c) mmstats contributors. All rights reserved.
"""Which checkpoint ``--resume`` takes: the one ``last_checkpoint`` names
when it is whole, else the newest complete one in the work dir."""
import glob
import os.path as osp
from typing import List, Optional, Tuple

from .damage import checkpoint_problem
from .files import PARTIAL

__all__ = ['resume_choice', 'candidates']


def candidates(work_dir: str) -> List[str]:
    """The checkpoints in ``work_dir`` (``*.pth`` files and directories,
    not the ``.partial`` ones being written), newest first (by the time
    they were last written).

    Example:
        >>> candidates('/nonexistent')
        []
    """
    found = [
        p for p in glob.glob(osp.join(work_dir, '*.pth'))
        if not p.endswith(PARTIAL)
    ]
    return sorted(found, key=lambda p: (osp.getmtime(p), p), reverse=True)


def _named(work_dir: str) -> Optional[str]:
    record = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(record):
        return None
    with open(record) as f:
        return f.read().strip() or None


def resume_choice(work_dir: str) -> Tuple[Optional[str], Optional[str]]:
    """The checkpoint to resume in ``work_dir`` and, when it is not the one
    ``last_checkpoint`` names (or none is), one line saying why.

    Args:
        work_dir (str): The run's work dir.

    Returns:
        tuple[str | None, str | None]: ``(checkpoint, why)``: ``why`` is
        None when ``last_checkpoint`` names a whole checkpoint (or there is
        no checkpoint and no record at all: a new run).

    Example:
        >>> resume_choice('/nonexistent')
        (None, None)
    """
    named = _named(work_dir)
    problem = None
    if named is not None:
        problem = checkpoint_problem(named)
        if problem is None:
            return named, None
    for path in candidates(work_dir):
        if path != named and checkpoint_problem(path) is None:
            why = (f'last_checkpoint names {named}, which {problem}'
                   if named else 'no last_checkpoint in the work dir')
            return path, (f'{why}: resuming the newest complete checkpoint, '
                          f'{path}')
    if named is None and not candidates(work_dir):
        return None, None
    why = (f'last_checkpoint names {named}, which {problem}'
           if named else f'no last_checkpoint in {work_dir}')
    return None, f'{why}, and no other checkpoint there is complete: ' \
                 'training from scratch'
