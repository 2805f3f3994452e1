# Copyright (c) mmstats contributors. All rights reserved.
"""Importing this module allowlists mmengine's checkpoint classes for
``torch.load(weights_only=True)`` (torch >= 2.6), so ``--resume`` works.

A one-line opt-in for any launcher, e.g. mmpretrain's ``tools/train.py``::

    custom_imports = dict(imports=['mmstats.launch.allow_checkpoints'])
"""
from .checkpoints import allow_mmengine_checkpoints

allow_mmengine_checkpoints()
