# Copyright (c) mmstats contributors. All rights reserved.
"""``python tools/test.py``: :mod:`mmstats.tools.test` (the launcher the
package installs as ``mmstats-test``), run from a clone, with
``tools/analysis`` importable (the curves plotted after training)."""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))  # tools/analysis
from mmstats.tools.test import main  # noqa: E402

if __name__ == '__main__':
    main()
    sys.exit(0)
