"""What a launch prints besides training: ``tools/train.py`` on 2 CPU
processes with the demo's DeepSpeed ZeRO-3 config (the fragment inherited
as is) shows each distinct Python warning at most once per rank
(``mmstats.tools.common.each_warning_once``; before it, torch's deprecated
collectives, which DeepSpeed calls on every step, came back 54 times), and
rank 0's log starts the run with one line saying what it is."""
import collections
import glob
import os
import os.path as osp
import re
import subprocess
import sys

import pytest

from tests.helpers.dist import free_port

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
ZERO3_CFG = osp.join(ROOT, 'projects', 'digits_demo', 'configs', 'strategies',
                     'resnet-mini_zero3_digits.py')
#: ``path:line: Category: message``, as ``warnings.formatwarning`` writes
WARNING_LINE = re.compile(r'^\S+:\d+: (\w*Warning): (.*)$')
DESCRIPTION = 'mmstats: FlexibleRunner, DeepSpeed ZeRO-3, 2 ranks, gloo'


def python_warnings(text: str) -> collections.Counter:
    """``(category, message)`` -> how often ``text`` shows it."""
    return collections.Counter(
        match.groups() for match in map(WARNING_LINE.match, text.splitlines())
        if match)


def test_the_check_reads_python_warnings():
    text = ('/x/c10d_logger.py:83: FutureWarning: `all_gather` is gone.\n'
            '  return func(*args, **kwargs)\n'
            '11/28 00:31:30 - mmengine - WARNING - "FileClient" will go\n'
            '/x/c10d_logger.py:83: FutureWarning: `all_gather` is gone.\n')
    assert python_warnings(text) == {
        ('FutureWarning', '`all_gather` is gone.'): 2
    }


def launch_per_rank(tmp_path, config: str, *options: str) -> list:
    """``tools/train.py CONFIG`` under torchrun on 2 processes, each
    rank's stdout and stderr in a file of its own (``--redirects 3``):
    ``[(stdout, stderr)]`` by local rank."""
    logs = tmp_path / 'torchrun'
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([ROOT,
                                    os.environ.get('PYTHONPATH', '')]),
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1')
    env.pop('DS_ACCELERATOR', None)  # the launcher sets it
    result = subprocess.run([
        sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
        '--master_port',
        str(free_port()), '--log-dir',
        str(logs), '--redirects', '3',
        osp.join(ROOT, 'tools',
                 'train.py'), config, '--launcher', 'pytorch', '--work-dir',
        str(tmp_path / 'work'), '--cfg-options', *options
    ],
                            cwd=ROOT,
                            env=env,
                            capture_output=True,
                            text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = []
    for rank in (0, 1):
        found = {}
        for stream in ('stdout', 'stderr'):
            [path] = glob.glob(
                str(logs / '**' / str(rank) / f'{stream}.log'), recursive=True)
            with open(path) as f:
                found[stream] = f.read()
        ranks.append((found['stdout'], found['stderr']))
    return ranks


def test_zero3_launch_shows_each_warning_once_per_rank(tmp_path):
    pytest.importorskip('deepspeed')
    import torch.distributed as dist
    ranks = launch_per_rank(tmp_path, ZERO3_CFG, 'train_cfg.max_epochs=1')
    deprecated = getattr(dist.all_gather_into_tensor, '__deprecated__', None)
    for rank, (stdout, stderr) in enumerate(ranks):
        shown = python_warnings(stderr + stdout)
        repeated = {key: n for key, n in shown.items() if n > 1}
        assert not repeated, f'rank {rank}: {repeated}'
        if deprecated is not None:  # this torch warns: seen, once
            assert shown[('FutureWarning', deprecated)] == 1, shown
        # mmengine's INFO line, on rank 0's console only
        described = stdout.count(f' - INFO - {DESCRIPTION}\n')
        assert described == (1 if rank == 0 else 0), stdout[-3000:]
    [log] = glob.glob(str(tmp_path / 'work' / '*' / '*.log'))
    with open(log) as f:
        assert f.read().count(DESCRIPTION) == 1
