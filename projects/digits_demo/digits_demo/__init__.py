# Copyright (c) mmstats contributors. All rights reserved.
"""The mmstats digits demo: a small ConvModule ResNet on scikit-learn's 8x8
handwritten digits, registered in its own ``digits_demo`` scope."""
from . import datasets, evaluation, models  # noqa: F401  (registration)
