"""``bash tools/dist_train.sh`` / ``dist_test.sh`` on 2 CPU processes, as a
user launches them, for the tests that check what a launch does."""
import os
import os.path as osp
import subprocess
import sys

from tests.helpers.dist import free_port
from tests.helpers.without_deepspeed import env_without_deepspeed

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def launch(script: str,
           args: list,
           deepspeed: bool = False) -> subprocess.CompletedProcess:
    """``bash tools/SCRIPT ARGS`` from the repository root with 2
    processes' worth of environment: this interpreter, one thread each, a
    free port; DeepSpeed importable only where ``deepspeed`` (a launch that
    does not use it spares its import, 2.7 s of CPU per rank)."""
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        PORT=str(free_port()),
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1')
    env.pop('DS_ACCELERATOR', None)  # the launcher sets it
    if not deepspeed:
        env = env_without_deepspeed(env)
    return subprocess.run(['bash',
                           osp.join(ROOT, 'tools', script), *args],
                          cwd=ROOT,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=300)
