# Copyright (c) mmstats contributors. All rights reserved.
"""What every layer may use: argument checks (:mod:`.args`), the version
floor and torch's moved APIs (:mod:`.compat`, :mod:`.torch_compat`), lazy
exports (:mod:`.lazy`), :class:`.refusal.LaunchRefused` (raised by
libraries too: a damaged checkpoint). The launcher's names that lived here
are in :mod:`mmstats.launch` now; their old paths warn until the release
:data:`.moved.MOVED` names."""
from .moved import alias_getattr
from .refusal import LaunchRefused

__all__ = ['LaunchRefused']

__getattr__ = alias_getattr(__name__, globals())
