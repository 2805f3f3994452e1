# Copyright (c) mmstats contributors. All rights reserved.
"""Model wrappers a config names from mmstats' ``MODEL_WRAPPERS`` registry
(``model_wrapper=dict(type='mmstats.FullyShard')``): :mod:`.fully_shard`
(torch's FSDP2 for a ``FlexibleRunner``, ``docs/sharding.md``)."""
from .fully_shard import FullyShard

__all__ = ['FullyShard']
