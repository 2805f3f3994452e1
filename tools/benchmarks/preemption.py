"""Time from a preemption notice to the launch's exit, on the demo.

Launches ``bash tools/dist_train.sh CONFIG 2`` (the demo's DDP strategy
config by default, 3 epochs, a checkpoint every epoch), waits for epoch 2's
first log line, sends ``--signal`` to one process (``--to rank1``: the rank
1 training process only; ``--to agent``: torchrun, which forwards it to
every rank, as Slurm's ``--signal`` or a Kubernetes stop does) and prints
the seconds until the launch ended, its exit status and the checkpoint it
left (``docs/checkpoints.md``, "When a run stops").

Usage: ``python tools/benchmarks/preemption.py [--config C] [--to rank1]
[--signal TERM] [--work-dir /tmp/preempt]``
"""
import argparse
import glob
import os
import os.path as osp
import shutil
import signal
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG = osp.join(ROOT, 'projects', 'digits_demo', 'configs', 'strategies',
                  'resnet-mini_ddp_digits.py')


def children(parent: int) -> list:
    """The pids whose parent is ``parent``."""
    return [
        int(p.split('/')[2]) for p in glob.glob('/proc/[0-9]*/stat')
        if _ppid(p) == parent
    ]


def rank_pid(agent: int, rank: int) -> int:
    """The training process of ``rank`` below torchrun's ``agent``."""
    for pid in children(agent):
        try:
            with open(f'/proc/{pid}/environ', 'rb') as f:
                env = f.read().split(b'\0')
        except OSError:
            continue
        if f'RANK={rank}'.encode() in env:
            return pid
    raise RuntimeError(f'no process of rank {rank} below {agent}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', default=CONFIG)
    parser.add_argument('--to', choices=['rank1', 'agent'], default='rank1')
    parser.add_argument('--signal', default='TERM')
    parser.add_argument('--work-dir', default='/tmp/mmstats_preemption')
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='accepted for the suite\'s smoke run: one launch of the demo '
        'is already this benchmark\'s smallest size')
    args = parser.parse_args()
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    log = osp.join(args.work_dir, 'launch.log')
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS='1')
    command = [
        'bash',
        osp.join(ROOT, 'tools', 'dist_train.sh'), args.config, '2',
        '--work-dir', args.work_dir, '--cfg-options', 'train_cfg.max_epochs=3',
        'default_hooks.checkpoint.interval=1'
    ]
    with open(log, 'w') as out:
        launch = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        while launch.poll() is None:
            with open(log) as f:
                if 'Epoch(train) [2][' in f.read():
                    break
            time.sleep(0.05)
        agent = children(launch.pid)[0]  # bash -> torchrun -> the ranks
        target = agent if args.to == 'agent' else rank_pid(agent, 1)
        number = getattr(signal, f'SIG{args.signal}')
        start, sent = time.monotonic(), time.time()
        os.kill(target, number)
        status = launch.wait()
        seconds = time.monotonic() - start
    with open(log) as f:
        text = f.read()
    stopped = [line for line in text.splitlines() if 'stopped on' in line]
    record = osp.join(args.work_dir, 'last_checkpoint')
    saved = osp.getmtime(record) - sent if osp.exists(record) else None
    print(f'{args.to} got SIG{args.signal} at epoch 2\'s first log line: '
          f'checkpoint complete {saved:.2f} s later, the launch ended '
          f'{seconds:.2f} s later, exit status {status}')
    print(stopped[-1] if stopped else 'no checkpoint line (see ' + log + ')')
    files = glob.glob(osp.join(args.work_dir, '*.pth'))
    print('checkpoints:', sorted(osp.basename(p) for p in files))


def _ppid(stat: str) -> int:
    try:
        with open(stat) as f:
            return int(f.read().rsplit(')', 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


if __name__ == '__main__':
    main()
