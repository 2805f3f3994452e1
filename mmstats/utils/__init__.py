# Copyright (c) mmstats contributors. All rights reserved.
from .checkpoint import allow_mmengine_checkpoints
from .launch_setup import (LaunchRefused, abort_distributed, check_checkpoints,
                           check_runner_type, finish_distributed,
                           init_cpu_distributed, registered_name,
                           setup_launcher)

__all__ = [
    'LaunchRefused', 'abort_distributed', 'allow_mmengine_checkpoints',
    'check_checkpoints', 'check_runner_type', 'finish_distributed',
    'init_cpu_distributed', 'registered_name', 'setup_launcher'
]
