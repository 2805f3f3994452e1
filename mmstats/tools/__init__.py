# Copyright (c) mmstats contributors. All rights reserved.
"""The launchers, installed with the package: ``mmstats-train`` /
``python -m mmstats.tools.train`` and ``mmstats-test`` /
``python -m mmstats.tools.test`` (a clone's ``tools/train.py`` and
``tools/test.py`` run the same code)."""
