# Copyright (c) mmstats contributors. All rights reserved.
"""Deprecated alias (see :data:`mmstats.utils.moved.MOVED`)."""
import sys

from .moved import alias_module

sys.modules[__name__] = alias_module(__name__)
