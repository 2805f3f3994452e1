# Copyright (c) mmstats contributors. All rights reserved.
__version__ = '0.1.0'
