# Copyright (c) mmstats contributors. All rights reserved.
from .checkpoint import allow_mmengine_checkpoints
from .launcher import (LaunchRefused, build_runner, check_checkpoints,
                       check_runner_type, enable_config_scope,
                       finish_distributed, init_cpu_distributed,
                       registered_name, setup_launcher)

__all__ = [
    'LaunchRefused', 'allow_mmengine_checkpoints', 'build_runner',
    'check_checkpoints', 'check_runner_type', 'enable_config_scope',
    'finish_distributed', 'init_cpu_distributed', 'registered_name',
    'setup_launcher'
]
