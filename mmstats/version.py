# Copyright (c) mmstats contributors. All rights reserved.
__version__ = '0.2.0'
