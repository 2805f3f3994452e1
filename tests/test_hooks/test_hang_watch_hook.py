"""HangWatchHook on real runs (``docs/hangs.md``): 4 gloo ranks, each of
which stalls once (in its data loader, forward, a hook before the next
collective, a checkpoint save), in a run that is also slow but healthy
where a naive watch would cry wolf (a slow first iteration, data-loader
start, validation, PreciseBN recomputation, checkpoint save); and a
2-process launch that ``on_hang='exit'`` ends, then ``--resume``
continues. The pieces (the rule, the options, the line) are in
``tests/test_health/test_hangs.py``."""
import glob
import os
import os.path as osp
import re
import time

from mmengine.hooks import Hook
from mmengine.runner import Runner

from tests.helpers import hangs  # noqa: F401  (registers the plan classes)
from tests.helpers.dist import run_distributed
from tests.helpers.launch import launch
from tests.helpers.runner import gloo_launch, toy_cfg

#: seconds: the watch's floor in these runs, and how slow the healthy parts
FLOOR, SLOW = 1.0, 1.0


def _plan_cfg(work_dir: str, world_size: int, **watch):
    """2 epochs of 4 iterations per rank, a save and a validation after
    each, with the stalls and slow parts of the plan."""
    cfg = toy_cfg(
        work_dir,
        num_samples=16 * 4 * world_size,
        max_epochs=2,
        model=dict(
            type='HangPlanModel',
            work_dir=work_dir,
            stall_rank=2,
            stall_forward=3,
            slow_first=SLOW,
            slow_val=SLOW / 4),
        default_hooks=dict(checkpoint=dict(interval=1)),
        custom_hooks=[
            dict(
                type='mmstats.HangWatchHook',
                floor=FLOOR,
                interval=0.25,
                **watch),
            dict(
                type='HangPlanHook',
                work_dir=work_dir,
                hook_rank=3,
                hook_iter=5,
                save_rank=0,
                save_epoch=2,
                slow_save=SLOW),
            dict(type='SlowPreciseBNHook', slow=SLOW, num_samples=64),
        ])
    cfg.train_dataloader.dataset = dict(
        type='HangPlanDataset',
        work_dir=work_dir,
        num_samples=16 * 4 * world_size,
        stall_rank=1,
        stall_item=16 * 2,
        slow_start=SLOW)
    cfg.val_dataloader.batch_size = 4  # 4 slow validation iterations
    return cfg


def _plan_worker(rank, world_size, work_dir):
    runner = Runner.from_cfg(gloo_launch(_plan_cfg(work_dir, world_size)))
    started = time.time()
    runner.train()
    log = ''
    if rank == 0:
        with open(osp.join(runner.log_dir, f'{runner.timestamp}.log')) as f:
            log = f.read()
    return dict(log=log, seconds=time.time() - started)


def test_four_ranks_each_stall_is_named_and_nothing_else(tmp_path):
    """One run on 4 ranks: rank 1 stalls in its data loader at iteration
    2, rank 2 in forward at iteration 3, rank 3 in a hook at iteration 5
    (the next collective is iteration 6's backward), rank 0, the reporter,
    in the epoch-2 checkpoint save. Each stall gets exactly one ERROR line
    naming that rank, phase and iteration, the 3 ranks waiting for it and
    its stack file, which holds the stalled frame; the slow but healthy
    parts (first iteration, loader start, validation, PreciseBN, the first
    save, each 1 s, the floor's length) get none; with 'warn' the run
    goes on to its end."""
    work_dir = str(tmp_path)
    ranks = run_distributed(_plan_worker, 4, work_dir, timeout=240)
    log = ranks[0]['log']
    lines = [line for line in log.splitlines() if ' - ERROR - ' in line]
    assert len(lines) == 4, '\n'.join(lines)
    expected = [
        (1, 'phase data of iteration 2', '__getitem__'),
        (2, 'phase forward of iteration 3', 'forward'),
        (3, 'phase hook (HangPlanHook.after_train_iter) of iteration 5',
         'after_train_iter'),
        (0, 'phase checkpoint_save (HangPlanHook.before_save_checkpoint) '
         'of iteration 8', 'before_save_checkpoint'),
    ]
    for line, (rank, where, frame) in zip(lines, expected):
        assert f'Hang: rank {rank} (host ' in line, line
        assert f') has been in {where} for ' in line, line
        # within the bound: the timeout and 3 looks, with a generous margin
        since, timeout = re.search(r'for (\d+) s \(timeout (\d+) s\)',
                                   line).groups()
        assert int(since) <= int(timeout) + 3 * 0.25 + 10, line
        assert '3 of 4 ranks wait for it' in line, line
        path = osp.join(work_dir, 'hangs', f'rank{rank}-')
        assert f'Python stacks in {path}' in line, line
        dump = re.search(r'Python stacks in (\S+\.txt)', line).group(1)
        stacks = open(dump).read()
        assert f'in {frame}\n' in stacks, stacks
        assert 'in stall_until_reported' in stacks, stacks
    assert "on_hang='warn': the run keeps waiting" in lines[0]
    assert sorted(os.listdir(osp.join(work_dir, 'hangs'))) == [
        'rank0-4.txt', 'rank1-1.txt', 'rank2-2.txt', 'rank3-3.txt'
    ]
    assert log.count('Hang over: rank(s) [') == 4
    assert 'Epoch(val) [2]' in log  # the run went on to its end


def _exit_config(tmp_path) -> str:
    """The toy run as a config file: rank 1 stalls for good in forward 6
    (epoch 2 of 4 iterations); 'exit'; gloo's timeout 120 s."""
    work_dir = str(tmp_path / 'work')
    cfg = _plan_cfg(work_dir, 2, on_hang='exit', timeout=1.5)
    cfg.model.update(
        stall_rank=1, stall_forward=6, release=False, slow_first=0, slow_val=0)
    cfg.train_dataloader.dataset.update(stall_rank=None, slow_start=0)
    cfg.custom_hooks = cfg.custom_hooks[:1]
    cfg.custom_imports = dict(
        imports=['tests.helpers.hangs'], allow_failed_imports=False)
    cfg.env_cfg.dist_cfg.timeout = 120
    cfg.pop('experiment_name')
    path = str(tmp_path / 'hang_exit.py')
    cfg.dump(path)
    return path


def test_exit_ends_the_launch_and_resume_continues(tmp_path):
    """2 processes through tools/dist_train.sh: rank 1 never leaves
    iteration 6's forward; with on_hang='exit' both ranks exit with status
    114, which only the watch gives (gloo's timeout, 120 s here, would end
    them with an error: status 1), torchrun names it, the line names rank
    1; the config resumed (``--resume``) then trains epoch 2 from epoch 1's
    checkpoint (on the session's pool of ranks: a second launch would add
    ~10 s). No wall time is asserted: the verdict does not depend on the
    machine's load."""
    config = _exit_config(tmp_path)
    work_dir = str(tmp_path / 'work')
    result = launch('dist_train.sh', [config, '2', '--work-dir', work_dir])
    text = result.stdout + result.stderr
    assert result.returncode != 0, text[-3000:]
    assert 'exitcode  : 114' in text, text[-3000:]
    log = open(glob.glob(osp.join(work_dir, '*', '*.log'))[0]).read()
    # one hang line (a rank whose collective the exit broke may log its
    # failure after it: the launchers write a run's failure to its .log)
    lines = [
        line for line in log.splitlines()
        if ' - ERROR - ' in line and 'Hang: ' in line
    ]
    assert len(lines) == 1, lines
    assert 'Hang: rank 1 (host ' in lines[0]
    assert 'phase forward of iteration 6' in lines[0]
    assert "on_hang='exit': every rank exits with status 114" in lines[0]
    assert osp.exists(osp.join(work_dir, 'hangs', 'rank1-1.txt'))
    assert 'Saving checkpoint at 1 epochs' in log
    assert 'Saving checkpoint at 2 epochs' not in log

    ranks = run_distributed(_resume_worker, 2, config, work_dir)
    assert ranks[0]['iters'] == [4, 8]  # from epoch 1's checkpoint to the end
    assert 'resumed epoch: 1, iter: 4' in ranks[0]['log']
    assert 'Saving checkpoint at 2 epochs' in ranks[0]['log']
    assert ' - ERROR - ' not in ranks[0]['log']


def _resume_worker(rank, world_size, config, work_dir):
    """The same config resumed (what ``--resume`` sets), without the
    stall, on the ranks of the session's pool."""
    from mmengine.config import Config

    from mmstats.launch import allow_mmengine_checkpoints
    allow_mmengine_checkpoints()  # what tools/train.py does for --resume
    cfg = Config.fromfile(config)
    cfg.update(work_dir=work_dir, resume=True)
    cfg.model.stall_rank = None
    runner = Runner.from_cfg(gloo_launch(cfg))
    start = []
    runner.register_hook(_FirstIter(start))
    runner.train()
    log = ''
    if rank == 0:
        with open(osp.join(runner.log_dir, f'{runner.timestamp}.log')) as f:
            log = f.read()
    return dict(iters=[start[0], runner.iter], log=log)


class _FirstIter(Hook):
    """Notes the iteration the resumed run starts at."""

    def __init__(self, start):
        self.start = start

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if not self.start:
            self.start.append(runner.iter)
