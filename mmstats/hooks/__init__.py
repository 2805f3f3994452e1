# Copyright (c) mmstats contributors. All rights reserved.
__all__ = []
