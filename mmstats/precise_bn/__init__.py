# Copyright (c) mmstats contributors. All rights reserved.
from ._old import (ESTIMATORS, check_args, preserve_rng_state,
                   update_bn_stats)

__all__ = ['ESTIMATORS', 'check_args', 'preserve_rng_state',
           'update_bn_stats']
