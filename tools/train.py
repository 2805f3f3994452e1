# Copyright (c) mmstats contributors. All rights reserved.
"""``python tools/train.py``: :mod:`mmstats.tools.train` (the launcher the
package installs as ``mmstats-train``), run from a clone, with
``tools/analysis`` importable (the curves plotted after training)."""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))  # tools/analysis
from mmstats.tools.train import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
