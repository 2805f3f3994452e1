# Copyright (c) mmstats contributors. All rights reserved.
"""mmstats: exact, cheap training statistics for mmengine."""
from .version import __version__

__all__ = ['__version__']
