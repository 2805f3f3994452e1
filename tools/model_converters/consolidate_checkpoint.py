# Copyright (c) mmstats contributors. All rights reserved.
"""Turn a sharded run's checkpoint into one ordinary mmengine checkpoint:
:mod:`mmstats.tools.consolidate`, which the wheel installs as
``mmstats-consolidate``.

    python tools/model_converters/consolidate_checkpoint.py \\
        work_dirs/fsdp/epoch_2.pth work_dirs/fsdp/epoch_2_full.pth
"""
import sys

from mmstats.tools.consolidate import cli, main  # noqa: F401

if __name__ == '__main__':
    sys.exit(cli())
