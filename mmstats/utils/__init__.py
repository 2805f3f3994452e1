# Copyright (c) mmstats contributors. All rights reserved.
from .checkpoint import allow_mmengine_checkpoints
from .launcher import (build_runner, check_runner_type, finish_distributed,
                       init_cpu_distributed, setup_launcher)

__all__ = [
    'allow_mmengine_checkpoints', 'build_runner', 'check_runner_type',
    'finish_distributed', 'init_cpu_distributed', 'setup_launcher'
]
