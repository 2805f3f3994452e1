# Copyright (c) mmstats contributors. All rights reserved.
"""A damaged checkpoint refused on every rank together, before anything
loads it."""
from typing import Optional

from mmstats.utils.refusal import LaunchRefused
from .damage import checkpoint_problem, deepspeed_world_size

__all__ = ['refuse_damaged', 'local_problem']

#: where a file any number of processes loads comes from
CONVERTER = 'mmstats-consolidate'
#: the same converter in a clone (``python CLONE_CONVERTER ...``)
CLONE_CONVERTER = 'tools/model_converters/consolidate_checkpoint.py'


def local_problem(path: str, resume: bool, world_size: int) -> Optional[str]:
    """This process's verdict on ``path``: the line that refuses it, or
    None.

    Example:
        >>> local_problem('/x/epoch_1.pth', False, 1)
        'checkpoint /x/epoch_1.pth does not exist'
    """
    problem = checkpoint_problem(path)
    if problem is not None:
        return f'checkpoint {path} {problem}'
    written_by = deepspeed_world_size(path) if resume else None
    if written_by is not None and written_by != world_size:
        return (f'checkpoint {path} is DeepSpeed\'s, written by {written_by} '
                f'processes, and this run has {world_size}: DeepSpeed resumes '
                'its optimizer state on the same number only. Resume with '
                f'{written_by} processes, or write one file any number loads '
                f'(`{CONVERTER} {path} OUT.pth`; in a clone `python '
                f'{CLONE_CONVERTER}`) and start from it '
                'with load_from=OUT.pth resume=False (a new optimizer state)')
    return None


def refuse_damaged(path: str, resume: bool = False) -> None:
    """Refuse ``path`` on every rank together when it is damaged on any
    (each rank checks what it sees: nodes may not share a disk; one
    ``all_gather_object``; all ranks must call it).

    Args:
        path (str): The checkpoint about to be loaded or resumed.
        resume (bool): Whether it resumes (a DeepSpeed checkpoint then
            needs the number of processes that wrote it). Defaults to
            False.

    Raises:
        LaunchRefused: On every rank, with the lowest failing rank's line
            (its rank named when not 0).

    Example:
        >>> refuse_damaged('/nonexistent/epoch_1.pth')
        Traceback (most recent call last):
        ...
        mmstats.utils.refusal.LaunchRefused: checkpoint ...
    """
    from mmengine.dist import all_gather_object, get_world_size, is_distributed

    from mmstats.dist import host_group
    mine = local_problem(path, resume, get_world_size())
    verdicts = all_gather_object(
        mine, group=host_group()) if is_distributed() else [mine]
    for rank, verdict in enumerate(verdicts):
        if verdict is not None:
            seen = f' (seen by rank {rank})' if rank else ''
            raise LaunchRefused(f'{verdict}{seen}')
