# Copyright (c) mmstats contributors. All rights reserved.
"""``python tools/train.py``: :mod:`mmstats.tools.train` (the launcher the
package installs as ``mmstats-train``), run from a clone."""
import sys

from mmstats.tools.train import cli, main  # noqa: F401

if __name__ == '__main__':
    sys.exit(cli())
