# Copyright (c) mmstats contributors. All rights reserved.
"""``python tools/test.py``: :mod:`mmstats.tools.test` (the launcher the
package installs as ``mmstats-test``), run from a clone."""
import sys

from mmstats.tools.test import cli, main  # noqa: F401

if __name__ == '__main__':
    sys.exit(cli())
