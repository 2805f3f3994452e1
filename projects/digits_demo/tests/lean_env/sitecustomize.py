"""The demo's tests run their subprocesses in the demo's own environment,
as ``make demo`` installs it: without DeepSpeed (the tests extra installs
it for the sharded-training tests). Python imports ``sitecustomize`` from
``PYTHONPATH`` at start-up; this one makes ``import deepspeed`` fail as it
does where DeepSpeed is not installed, so mmengine's runner module, which
imports DeepSpeed whenever it can, leaves it out (2-3 s of CPU per process).
"""
import sys

sys.modules['deepspeed'] = None  # ImportError on import, as if absent
