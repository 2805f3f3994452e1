# Copyright (c) mmstats contributors. All rights reserved.
"""The random number generators a training step draws from, captured and
restored, on this rank and on all of them.

A resumed run continues exactly only if every rank's generators continue
where they were when the checkpoint was written: Python's ``random``,
numpy's global generator (mmengine's and OpenMMLab's transforms draw from
it), torch's CPU generator and, where there is one, each CUDA device's.
mmengine reseeds them at resume (``randomness.seed``), which restarts the
sequence of the first epoch. ``RandomStateHook`` (``docs/checkpoints.md``)
uses these functions.
"""
import random
from typing import List, Optional

import numpy as np
import torch

__all__ = [
    'capture_random_state', 'restore_random_state', 'gather_states',
    'STATES_KEY', 'STATES_HELD_KEY'
]


def capture_random_state() -> dict:
    """This process's generator states (host objects, picklable).

    Example:
        >>> state = capture_random_state()
        >>> a = torch.rand(1); restore_random_state(state)
        >>> bool(torch.rand(1) == a)
        True
    """
    name, key, pos, has_gauss, gauss = np.random.get_state()
    state = dict(
        python=random.getstate(),
        # plain ints: a checkpoint loads with torch.load(weights_only=True)
        numpy=(name, key.tolist(), pos, has_gauss, gauss),
        torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def restore_random_state(state: dict) -> None:
    """Set this process's generators to ``state``
    (:func:`capture_random_state`'s). CUDA states are set where this
    process has as many devices as the one that captured them.

    Example:
        >>> restore_random_state(capture_random_state())
    """
    random.setstate(state['python'])
    name, key, pos, has_gauss, gauss = state['numpy']
    np.random.set_state(
        (name, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state['torch'])
    cuda = state.get('cuda')
    if cuda is not None and torch.cuda.is_available() and len(
            cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def gather_states(state: Optional[dict] = None) -> List[dict]:
    """Every rank's ``state`` (default: :func:`capture_random_state` now),
    in rank order, on every rank (one ``all_gather_object``; all ranks
    must call it). One process: a list of one.

    Args:
        state (dict, optional): This rank's states to gather instead of the
            generators' current ones (e.g. those validation set aside).
            Defaults to None.

    Example:
        >>> len(gather_states())
        1
    """
    from mmengine.dist import all_gather_object
    return all_gather_object(capture_random_state() if state is
                             None else state)


#: the message hub's runtime-info key of every rank's generator states (what
#: ``RandomStateHook`` restores at a resume; ``CheckpointHook``'s preemption
#: save writes it too)
STATES_KEY = 'mmstats/random_states'
#: set True by a save that keeps the generators' states its own way (the
#: preemption save of ``CheckpointHook``, which replays them): the next
#: save leaves :data:`STATES_KEY` as that save set it, once
#: (``RandomStateHook``'s save wrapper reads and clears it)
STATES_HELD_KEY = 'mmstats/random_states_held'
