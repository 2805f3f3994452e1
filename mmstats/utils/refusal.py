# Copyright (c) mmstats contributors. All rights reserved.
"""The one exception every layer may raise to refuse a launch."""

__all__ = ['LaunchRefused']


class LaunchRefused(ValueError):
    """A config or a checkpoint the launcher refuses before any process
    trains or evaluates; the message names the way out. ``tools/train.py``
    prints it once (rank 0). It lives on the ground floor because libraries
    raise it too (a damaged checkpoint: :mod:`mmstats.checkpoints`);
    :mod:`mmstats.launch` exports it.

    Example:
        >>> issubclass(LaunchRefused, ValueError)  # as before: ValueError
        True
    """
