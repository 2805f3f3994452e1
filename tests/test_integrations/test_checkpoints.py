"""Checkpoints a sharded run can trust (``docs/checkpoints.md``), as a user
makes them: ``bash tools/dist_train.sh CFG 2`` on the demo's strategy
configs (2 CPU gloo processes), for DDP, FSDP1 (sharded and full state
dicts), FSDP2 (full and sharded), DeepSpeed ZeRO-1, -2 and -3.

For each, one module-scoped set of runs (``trained``):

- ``full``: ``N`` epochs uninterrupted, a checkpoint and a validation after
  every epoch, a log line at every iteration;
- ``part``: the same config ended after epoch ``N - 1`` (its checkpoint
  written, as a preempted job), then ``--resume`` to ``N`` in the same work
  dir (the demo's four configs); for their variants (a ``state_dict_cfg``,
  a ZeRO stage) ``--resume`` from a copy of ``full``'s checkpoint of epoch
  ``N - 1``, in a work dir of its own.

The resumed run's per-iteration losses of the last epoch (the all-rank
``stats/loss/mean`` of every iteration) and its final weights must equal
the uninterrupted run's: on CPU every strategy here is deterministic, and
all of them resume bitwise (measured: difference 0.0), so the tolerance is
0. Each checkpoint must hold full tensors of the model's shapes, and must
evaluate to the accuracy the run logged when it saved it: on 2 processes
with the strategy (``dist_test.sh``), on 1 process without it (a plain
``Runner`` config: ``tools/test.py`` reads the sharded directory whole), and
as the file ``tools/model_converters/consolidate_checkpoint.py`` writes for
``load_from``.
"""
import glob
import json
import os
import os.path as osp
import re
import subprocess
from typing import NamedTuple

import pytest
import torch
from mmengine.config import Config

from tests.helpers.launch import launch
from tests.test_integrations.test_tools_exit import load_tool

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
STRATEGY_CFG = osp.join(ROOT, 'projects', 'digits_demo', 'configs',
                        'strategies', 'resnet-mini_{}_digits.py')
PLAIN_CFG = osp.join(ROOT, 'projects', 'digits_demo', 'configs', 'demo',
                     'resnet-mini_1xb64-precise-bn-stats_digits.py')
N = 2  # epochs; the interrupted run ends after epoch N - 1
ITERS = 12  # per epoch: 1437 samples, 2 ranks x 64
# name: (demo strategy config, --cfg-options, the format of its checkpoint);
# the demo's four configs are interrupted and resumed, their variants (a
# state_dict_cfg, a ZeRO stage) resume the uninterrupted run's checkpoint
# of epoch N - 1 in a work dir of their own (the same resume, a launch less)
INTERRUPTED = ('ddp', 'fsdp', 'fsdp2', 'zero3')
CELLS = {
    'ddp': ('ddp', (), 'file'),
    'fsdp': ('fsdp', (), 'sharded'),
    'fsdp_full': ('fsdp', ('strategy.state_dict_cfg=full', ), 'file'),
    'fsdp2': ('fsdp2', (), 'file'),
    'fsdp2_sharded':
    ('fsdp2', ('strategy.state_dict_cfg=sharded', ), 'sharded'),
    'zero1': ('zero3', ('strategy.zero_optimization.stage=1', ), 'deepspeed'),
    'zero2': ('zero3', ('strategy.zero_optimization.stage=2', ), 'deepspeed'),
    'zero3': ('zero3', (), 'deepspeed'),
}
COMMON = (f'train_cfg.max_epochs={N}', 'default_hooks.logger.interval=1',
          'default_hooks.checkpoint.interval=1')


class Run(NamedTuple):
    cell: str
    config: str  # the strategy config
    options: tuple  # --cfg-options
    deepspeed: bool
    full: str  # work dirs
    part: str
    first: subprocess.CompletedProcess  # the uninterrupted run
    resumed: subprocess.CompletedProcess


def with_hook(tmp, config: str, module: str, hook: dict) -> str:
    """``config`` plus one hook of the test tree (``custom_imports`` of
    ``module``, as any user hook), written beside it in ``tmp``."""
    hooks = Config.fromfile(config).to_dict()['custom_hooks']
    child = tmp / f"{hook['type']}.py"
    child.write_text(f'_base_ = [{config!r}]\n'
                     f"custom_imports = dict(imports=[{module!r}], "
                     'allow_failed_imports=False)\n'
                     f'custom_hooks = {hooks!r} + [{hook!r}]\n')
    return str(child)


def recorded_config(tmp, config: str) -> str:
    """``config`` plus the hook that writes down what the launcher built
    (``tests/helpers/launch_recorder.py``)."""
    return with_hook(tmp, config, 'tests.helpers.launch_recorder',
                     dict(type='LaunchRecorderHook'))


def interrupted_config(tmp, config: str) -> str:
    """``config`` plus a hook that ends training after epoch ``N - 1``."""
    return with_hook(tmp, config, 'tests.helpers.interrupt',
                     dict(type='InterruptAfterEpochHook', epoch=N - 1))


@pytest.fixture(scope='module', params=list(CELLS))
def trained(request, tmp_path_factory):
    cell = request.param
    name, options, _ = CELLS[cell]
    deepspeed = name == 'zero3'
    if deepspeed:
        pytest.importorskip('deepspeed')
    tmp = tmp_path_factory.mktemp(cell)
    config = STRATEGY_CFG.format(name)
    options = (*COMMON, *options)
    full, part = str(tmp / 'full'), str(tmp / 'part')
    runs = [(recorded_config(tmp, config), full, [])]
    if cell in INTERRUPTED:
        runs.append((interrupted_config(tmp, config), part, []))
    runs.append((config, part, ['--resume']))
    results = []
    for cfg, work_dir, extra in runs:
        if work_dir == part and not osp.exists(part):  # a variant
            copy_checkpoint(full, part, f'epoch_{N - 1}.pth')
        # DDP's first launch with DeepSpeed importable: it must say nothing
        with_deepspeed = deepspeed or (cell == 'ddp' and not results)
        result = launch('dist_train.sh', [
            cfg, '2', '--work-dir', work_dir, *extra, '--cfg-options', *options
        ], with_deepspeed)
        assert result.returncode == 0, (cell, result.stderr[-4000:])
        results.append(result)
    return Run(cell, config, options, deepspeed, full, part, results[0],
               result)


def copy_checkpoint(src: str, dst: str, name: str) -> None:
    """``src``'s checkpoint ``name`` into the new work dir ``dst``, with
    the ``last_checkpoint`` that names it (no logs: ``dst``'s records are
    the resumed run's only)."""
    import shutil
    os.makedirs(dst)
    path = osp.join(src, name)
    (shutil.copytree if osp.isdir(path) else shutil.copy)(path,
                                                          osp.join(dst, name))
    with open(osp.join(dst, 'last_checkpoint'), 'w') as f:
        f.write(osp.join(dst, name))


def records(work_dir: str) -> dict:
    """``{step: record}`` of every run's scalars.json in ``work_dir``, the
    records of a step merged (training steps only: ``stats/loss/mean``)."""
    out = {}
    for path in sorted(
            glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                out.setdefault(record['step'], {}).update(record)
    return {k: v for k, v in out.items() if 'stats/loss/mean' in v}


def logged_accuracy(work_dir: str) -> dict:
    """``{epoch: accuracy}`` the run logged at each validation."""
    text = ''.join(
        open(p).read() for p in glob.glob(osp.join(work_dir, '*', '*.log')))
    return {
        int(epoch): float(acc)
        for epoch, acc in re.findall(
            r'Epoch\(val\) \[(\d+)\]\[\d+/\d+\]\s+accuracy: ([\d.]+)', text)
    }


def full_weights(path: str) -> dict:
    """The model state dict of a checkpoint, whatever its format."""
    from mmstats.strategies import read_full_checkpoint
    if osp.isdir(path):
        return read_full_checkpoint(path)['state_dict']
    return torch.load(
        path, map_location='cpu', weights_only=False)['state_dict']


# the runs of one cell share its fixture: one xdist worker runs them
CHECKPOINTS = pytest.mark.xdist_group('checkpoints')
# 20 launches and 8 evaluations, ~230 s on 2 cores: `make test-checkpoints`
# (.ci/run runs it after `make test`)
pytestmark = pytest.mark.checkpoint_matrix

# what each cell's launch builds: strategy, wrapper (or a base class), ZeRO
BUILT = {
    'ddp': ('DDPStrategy', 'MMDistributedDataParallel', None),
    'fsdp': ('FSDPStrategy', 'MMFullyShardedDataParallel', None),
    'fsdp_full': ('FSDPStrategy', 'MMFullyShardedDataParallel', None),
    'fsdp2': ('FSDP2Strategy', 'FSDPModule', None),
    'fsdp2_sharded': ('FSDP2Strategy', 'FSDPModule', None),
    'zero1': ('DeepSpeedStrategy', 'MMDeepSpeedEngineWrapper', 1),
    'zero2': ('DeepSpeedStrategy', 'MMDeepSpeedEngineWrapper', 2),
    'zero3': ('DeepSpeedStrategy', 'MMDeepSpeedEngineWrapper', 3),
}


@CHECKPOINTS
def test_dist_train_builds_the_strategys_wrapper(trained):
    """What the launcher built on each rank (``LaunchRecorderHook``): the
    runner, mmstats' strategy, its wrapper, gloo over 2 processes; FSDP
    ranks hold a shard each, ZeRO the stage asked for; DeepSpeed's
    accelerator named, not guessed (DDP's launch can import it too)."""
    from mmengine.registry import DefaultScope

    from digits_demo.registry import MODELS
    with DefaultScope.overwrite_default_scope('digits_demo'):
        model = MODELS.build(Config.fromfile(PLAIN_CFG).model)
    whole = sum(p.numel() for p in model.parameters())
    strategy, wrapper, stage = BUILT[trained.cell]
    records = []
    for rank in range(2):
        path = osp.join(trained.full, f'launch_rank{rank}.json')
        with open(path) as f:
            records.append(json.load(f))
    for record in records:
        assert record['runner'] == 'FlexibleRunner'
        assert record['strategy'] == strategy
        assert wrapper in record['wrapper_bases'], record
        assert (record['backend'], record['world_size']) == ('gloo', 2)
        assert record.get('zero_stage') == stage
    held = [r['local_numel'] for r in records]
    if 'fsdp' in trained.cell:  # each rank holds a shard, together all
        assert max(held) < whole <= sum(held), (held, whole)
    elif stage != 3:
        assert held == [whole, whole]
    log = trained.first.stdout + trained.first.stderr
    assert 'Setting accelerator to CPU' not in log


@CHECKPOINTS
def test_resume_continues_the_run_exactly(trained):
    """The last epoch of the resumed run: the same iterations, the same
    per-iteration all-rank losses, the same final weights (bitwise)."""
    full, part = records(trained.full), records(trained.part)
    last = range((N - 1) * ITERS + 1, N * ITERS + 1)
    assert sorted(full) == list(range(1, N * ITERS + 1))
    # the interrupted run's steps and the resumed run's, or the latter only
    first = 1 if trained.cell in INTERRUPTED else last[0]
    assert sorted(part) == list(range(first, N * ITERS + 1))
    for step in part:
        assert part[step]['stats/loss/mean'] == full[step][
            'stats/loss/mean'], (trained.cell, step)
        assert part[step]['lr'] == full[step]['lr']
    a = full_weights(osp.join(trained.full, f'epoch_{N}.pth'))
    b = full_weights(osp.join(trained.part, f'epoch_{N}.pth'))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), (trained.cell, key)
    accuracy = logged_accuracy(trained.full)
    assert logged_accuracy(trained.part) == {
        epoch: accuracy[epoch]
        for epoch in range(1 if trained.cell in INTERRUPTED else N, N + 1)
    }
    log = trained.resumed.stdout + trained.resumed.stderr
    assert f'resumed epoch: {N - 1}' in log
    assert 'not defined in message_hub' not in log
    assert 'RandomStateHook' not in log  # no world-size warning


@CHECKPOINTS
def test_checkpoint_holds_every_ranks_shard(trained):
    """Full tensors of the unsharded model's shapes (never a rank's shard),
    in the format the strategy names; the optimizer state of every
    parameter where the format holds it in one file."""
    from mmengine.registry import DefaultScope

    from digits_demo.registry import MODELS
    from mmstats.strategies import (is_deepspeed_checkpoint,
                                    is_sharded_checkpoint)
    path = osp.join(trained.full, f'epoch_{N}.pth')
    fmt = CELLS[trained.cell][2]
    assert {
        'file': osp.isfile,
        'sharded': is_sharded_checkpoint,
        'deepspeed': is_deepspeed_checkpoint
    }[fmt](
        path)
    with DefaultScope.overwrite_default_scope('digits_demo'):
        model = MODELS.build(Config.fromfile(PLAIN_CFG).model)
    want = {k: v.shape for k, v in model.state_dict().items()}
    weights = full_weights(path)  # DDP's keys: module.*, as mmengine's
    assert {
        re.sub(r'^module\.', '', k): v.shape
        for k, v in weights.items()
    } == want
    assert all(type(v) is torch.Tensor for v in weights.values())
    if fmt == 'file':
        checkpoint = torch.load(path, map_location='cpu', weights_only=False)
        state = checkpoint['optimizer']['state']
        params = dict(model.named_parameters())
        assert len(state) == len(params)
        for key, value in state.items():
            name = key if isinstance(key, str) else list(params)[key]
            assert value['momentum_buffer'].shape == params[name].shape


@CHECKPOINTS
def test_checkpoint_evaluates_on_2_and_1_processes(trained, tmp_path):
    """dist_test.sh with the strategy (2 processes), tools/test.py with the
    plain config (1 process, no strategy), and the converter's file:
    each reports the accuracy the run logged when it saved the
    checkpoint."""
    path = osp.join(trained.full, f'epoch_{N - 1}.pth')
    logged = logged_accuracy(trained.full)[N - 1]
    result = launch('dist_test.sh', [
        trained.config, path, '2', '--work-dir',
        str(tmp_path / 'dist'), '--cfg-options', *trained.options
    ], trained.deepspeed)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.findall(r'test: accuracy=([\d.]+)', result.stdout)
    assert len(found) == 1 and abs(float(found[0]) - logged) < 0.5, (found,
                                                                     logged)
    test = load_tool('test')
    one = test.main([PLAIN_CFG, path, '--work-dir', str(tmp_path / 'one')])
    assert abs(one['accuracy'] - logged) < 0.5, (one, logged)
    out = load_tool('model_converters/consolidate_checkpoint').main(
        [path, str(tmp_path / 'consolidated.pth')])
    again = test.main([PLAIN_CFG, out, '--work-dir', str(tmp_path / 'file')])
    assert abs(again['accuracy'] - logged) < 0.5, (again, logged)
