# Copyright (c) mmstats contributors. All rights reserved.
"""What a run that stops keeps: checkpoints written complete or not at all
(:mod:`.files`), damaged ones named before anything loads them
(:mod:`.damage`, :mod:`.together`), the newest complete one found
(:mod:`.discovery`) and a preemption notice agreed by every rank
(:mod:`.stop`). ``docs/checkpoints.md``, "When a run stops".

Nothing here knows a Runner: :class:`mmstats.CheckpointHook` (in
``mmstats/hooks/``) calls it.
"""
from .damage import checkpoint_problem, deepspeed_world_size
from .discovery import resume_choice
from .files import (COMPLETE, PARTIAL, finish_save, partial_name,
                    remove_checkpoint, write_last_checkpoint)
from .stop import PREEMPTED_EXIT_CODE, Preempted, StopRequest, agree
from .together import refuse_damaged

__all__ = [
    'COMPLETE', 'PARTIAL', 'PREEMPTED_EXIT_CODE', 'Preempted', 'StopRequest',
    'agree', 'checkpoint_problem', 'deepspeed_world_size', 'finish_save',
    'partial_name', 'refuse_damaged', 'remove_checkpoint', 'resume_choice',
    'write_last_checkpoint'
]
