# Copyright (c) mmstats contributors. All rights reserved.
"""What a launcher does around the Runner, above the hooks: the config
prepared for its launcher and the process groups' set-up and end
(:mod:`.setup`), the opt-in patch of mmengine's ``Runner.from_cfg`` for
another package's ``tools/train.py`` (:mod:`.cpu_dist`), and the
``torch.load`` allowlist of mmengine's checkpoint classes
(:mod:`.checkpoints`, opt-in :mod:`.allow_checkpoints`). Every patch of an
mmengine object is named in the table of ``docs/architecture.md``.

Importing this package changes nothing process-wide: :mod:`.cpu_dist` and
:mod:`.allow_checkpoints` act when they are imported themselves.
"""
from .checkpoints import allow_mmengine_checkpoints
from .setup import (LaunchRefused, abort_distributed, check_checkpoints,
                    check_runner_type, finish_distributed,
                    init_cpu_distributed, registered_name, setup_launcher)

__all__ = [
    'LaunchRefused', 'abort_distributed', 'allow_mmengine_checkpoints',
    'check_checkpoints', 'check_runner_type', 'finish_distributed',
    'init_cpu_distributed', 'registered_name', 'setup_launcher'
]
