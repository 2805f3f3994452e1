"""Subprocesses of the tests that do not use DeepSpeed run as if it were
not installed (the tests extra installs it for the sharded-training tests):
the demo's tools as ``make demo`` installs them, and the launches of the
DDP and FSDP strategies. Python imports ``sitecustomize`` from
``PYTHONPATH`` at start-up; this one makes ``import deepspeed`` fail as it
does where DeepSpeed is absent, so mmengine's runner module, which imports
DeepSpeed whenever it can, leaves it out (2.7 s of CPU per process). Use
:func:`tests.helpers.without_deepspeed.env_without_deepspeed`.
"""
import sys

sys.modules['deepspeed'] = None  # ImportError on import, as if absent
