"""One command for every strategy: ``tools/train.py`` / ``dist_train.sh``
build the runner the OpenMMLab way and do the CPU set-up of each strategy.

What ``bash tools/dist_train.sh CFG 2`` builds from each demo strategy
config is checked on the launches of ``test_checkpoints.py`` (one set of
runs for both). These tests check the config side:
every fragment under ``configs/_base_/strategies/`` merges into full configs
(the demo's and an mmpretrain-style one) without an edit, and the settings
mmengine cannot run are refused with the fix.
"""
import os
import os.path as osp

import pytest
import torch
import torch.distributed as dist
from mmengine.config import Config

from mmstats.launch import (LaunchRefused, check_checkpoints,
                            check_runner_type, setup_launcher)
from mmstats.tools.launcher import build_runner
from tests.helpers.launch import launch
from tests.helpers.torch_versions import DEEPSPEED
from tests.test_integrations.test_tools_exit import load_tool

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
FRAGMENTS = osp.join(ROOT, 'configs', '_base_', 'strategies')
DEMO = osp.join(ROOT, 'projects', 'digits_demo', 'configs', 'demo',
                'resnet-mini_1xb64-precise-bn-stats_digits.py')
MMPRETRAIN_STYLE = osp.join(ROOT, 'tests', 'data', 'configs',
                            'mmpretrain_style_resnet18_cifar.py')
STRATEGY_CFG = osp.join(ROOT, 'projects', 'digits_demo', 'configs',
                        'strategies', 'resnet-mini_{}_digits.py')
FRAGMENT_NAMES = sorted(f[:-3] for f in os.listdir(FRAGMENTS)
                        if f.endswith('.py'))


def merged(tmp_path, base: str, fragment: str) -> Config:
    """``base`` and a strategy fragment inherited side by side, as a user
    writes it: ``_base_ = [base, fragment]`` and nothing else."""
    child = tmp_path / f'{osp.basename(base)[:-3]}_{fragment}.py'
    child.write_text(f'_base_ = [{base!r}, '
                     f'{osp.join(FRAGMENTS, fragment + ".py")!r}]\n')
    return Config.fromfile(str(child))


@pytest.mark.parametrize(
    'base', [DEMO, MMPRETRAIN_STYLE], ids=['demo', 'mmpretrain_style'])
@pytest.mark.parametrize('fragment', FRAGMENT_NAMES)
def test_every_fragment_merges_into_a_full_config(tmp_path, base, fragment):
    full = Config.fromfile(base)
    cfg = merged(tmp_path, base, fragment)
    assert cfg.runner_type == 'FlexibleRunner'
    assert cfg.strategy.type in ('DDPStrategy', 'mmstats.FSDPStrategy',
                                 'mmstats.FSDP2Strategy',
                                 'mmstats.DeepSpeedStrategy')
    for key in ('optim_wrapper', 'train_dataloader', 'custom_hooks', 'model',
                'param_scheduler'):
        assert cfg[key] == full[key], key  # the user's own, untouched
    check_runner_type(cfg)


def test_the_fragments_are_the_ones_the_docs_name():
    assert FRAGMENT_NAMES == ['ddp', 'deepspeed_zero3', 'fsdp', 'fsdp2']


@pytest.fixture
def cpu_with_a_group(monkeypatch):
    """The CPU path of :func:`setup_launcher` on any machine, with the
    process group taken as created (only the config changes)."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(dist, 'is_initialized', lambda: True)
    calls = []
    if DEEPSPEED:
        import deepspeed
        monkeypatch.setattr(deepspeed, 'init_distributed',
                            lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv('DS_ACCELERATOR', raising=False)
    return calls


@pytest.mark.parametrize(
    'base', [DEMO, MMPRETRAIN_STYLE], ids=['demo', 'mmpretrain_style'])
def test_cpu_set_up_of_each_strategy(tmp_path, base, cpu_with_a_group):
    cfgs = {f: merged(tmp_path, base, f) for f in FRAGMENT_NAMES}
    for cfg in cfgs.values():
        if cfg.strategy.type.endswith('DeepSpeedStrategy') and not DEEPSPEED:
            with pytest.raises(
                    LaunchRefused, match='mmengine-stats.deepspeed'):
                setup_launcher(cfg)
            continue
        cfg.launcher = 'pytorch'
        setup_launcher(cfg)
        assert cfg.env_cfg.dist_cfg.backend == 'gloo'
        assert 'model_wrapper_cfg' not in cfg  # a Runner's, not ours
    ddp = cfgs['ddp'].strategy.model_wrapper
    assert ddp.type == 'MMDistributedDataParallel' and ddp.device_ids is None
    fsdp = cfgs['fsdp'].strategy.model_wrapper
    assert fsdp.device_id == 'cpu' and fsdp.use_orig_params
    fsdp2 = cfgs['fsdp2'].strategy.model_wrapper
    assert fsdp2.type == 'mmstats.FullyShard' and 'device_ids' not in fsdp2
    zero3 = cfgs['deepspeed_zero3']
    if not DEEPSPEED:
        return
    assert zero3.optim_wrapper.type == 'DeepSpeedOptimWrapper'
    assert zero3.optim_wrapper.optimizer == Config.fromfile(
        base).optim_wrapper.optimizer
    if base == MMPRETRAIN_STYLE:  # its clip_grad, as DeepSpeed's setting
        assert 'clip_grad' not in zero3.optim_wrapper
        assert zero3.strategy.gradient_clipping == 5.0
    if cpu_with_a_group is not None:
        assert os.environ['DS_ACCELERATOR'] == 'cpu'


def test_fsdp2_blocks_match_the_demo_and_mmpretrain_backbones(tmp_path):
    import re
    blocks = re.compile(
        merged(tmp_path, DEMO, 'fsdp2').strategy.model_wrapper.blocks)
    for name in ('backbone.stages.0', 'backbone.layer1', 'backbone.layers.11'):
        assert blocks.fullmatch(name), name
    assert not blocks.fullmatch('backbone.stages.0.conv1')


def test_one_process_with_a_sharding_strategy_gets_a_world_of_one(
        tmp_path, monkeypatch, cpu_with_a_group):
    for key in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR',
                'MASTER_PORT'):
        monkeypatch.delenv(key, raising=False)
    cfg = merged(tmp_path, DEMO, 'fsdp')
    cfg.launcher = 'none'
    setup_launcher(cfg)
    assert cfg.launcher == 'pytorch'
    assert (os.environ['RANK'], os.environ['WORLD_SIZE']) == ('0', '1')
    assert cfg.strategy.model_wrapper.device_id == 'cpu'
    ddp = merged(tmp_path, DEMO, 'ddp')  # DDP's wrapper needs a group too
    ddp.launcher = 'none'
    setup_launcher(ddp)
    assert ddp.launcher == 'pytorch'
    plain = Config.fromfile(DEMO)  # a Runner on one process: no group
    plain.launcher = 'none'
    setup_launcher(plain)
    assert plain.launcher == 'none'


def test_a_strategy_without_runner_type_is_refused(tmp_path):
    cfg = Config.fromfile(DEMO)
    cfg.strategy = dict(type='FSDPStrategy')
    cfg.launcher = 'none'
    with pytest.raises(ValueError, match="runner_type = 'FlexibleRunner'"):
        build_runner(cfg)
    cfg.runner_type = 'Runner'
    with pytest.raises(ValueError, match='strategy=FSDPStrategy'):
        check_runner_type(cfg)


@pytest.mark.parametrize('optim, message', [
    (dict(type='AmpOptimWrapper'), 'strategy.bf16'),
    (dict(accumulative_counts=4), 'gradient_accumulation_steps=4'),
    (dict(clip_grad=dict(max_norm=1.0, norm_type=1)), 'gradient_clipping'),
])
def test_deepspeed_refuses_what_it_cannot_take(tmp_path, optim, message):
    cfg = merged(tmp_path, DEMO, 'deepspeed_zero3')
    cfg.optim_wrapper.update(optim)
    cfg.launcher = 'none'  # refused before anything is launched
    with pytest.raises(ValueError, match=message):
        setup_launcher(cfg)


def test_fsdp1_resume_refused_under_mmengines_strategy_only(tmp_path):
    """The fragment's ``mmstats.FSDPStrategy`` resumes; mmengine's own
    ``FSDPStrategy`` cannot and is refused, naming ours."""
    cfg = merged(tmp_path, DEMO, 'fsdp')
    cfg.resume = True
    check_checkpoints(cfg)
    cfg.strategy.type = 'FSDPStrategy'
    with pytest.raises(LaunchRefused, match="type='mmstats.FSDPStrategy'"):
        check_checkpoints(cfg)
    cfg.resume = False
    check_checkpoints(cfg)  # its checkpoints load (load_from)


def test_fully_shard_under_ddp_strategy_is_refused(tmp_path):
    """mmengine's DDPStrategy would save rank 0's FSDP2 shards as the
    model: refused by the launcher and by FullyShard itself (another
    package's launcher)."""
    from torch import nn

    from mmstats.wrappers import FullyShard
    cfg = merged(tmp_path, DEMO, 'fsdp2')
    cfg.strategy.type = 'DDPStrategy'
    with pytest.raises(LaunchRefused, match='mmstats.FSDP2Strategy'):
        check_checkpoints(cfg)
    with pytest.raises(ValueError, match='mmstats.FSDP2Strategy'):
        FullyShard(nn.Linear(2, 2), blocks='x', device_ids=[0])


@pytest.mark.parametrize('fragment, message',
                         [('deepspeed_zero3', 'strategy.bf16.enabled'),
                          ('fsdp2', 'param_dtype=bfloat16')])
def test_amp_flag_refused_where_the_strategy_has_its_own(
        tmp_path, monkeypatch, fragment, message):
    train = load_tool('train')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    with pytest.raises(ValueError, match=message):
        train.use_amp(merged(tmp_path, DEMO, fragment))
    cfg = merged(tmp_path, DEMO, 'fsdp')
    train.use_amp(cfg)  # mmengine's FSDPStrategy takes AmpOptimWrapper
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'


# ------------------------------------------------------ real launches
def test_flexible_runner_built_directly_needs_no_runner_type(
        tmp_path, cpu_with_a_group):
    """``FlexibleRunner.from_cfg(cfg)`` called by hand (cpu_dist wraps it)
    builds a FlexibleRunner whatever ``cfg.runner_type`` says; only a
    ``Runner`` given a strategy is refused."""
    from mmengine.runner import FlexibleRunner, Runner
    cfg = Config.fromfile(DEMO)
    cfg.strategy = dict(type='FSDPStrategy')
    cfg.launcher = 'pytorch'
    setup_launcher(cfg, runner_type=FlexibleRunner)
    assert cfg.strategy.model_wrapper.device_id == 'cpu'
    with pytest.raises(ValueError, match='runner_type'):
        setup_launcher(cfg, runner_type=Runner)


def test_resume_with_nothing_to_resume_says_so_and_starts_fresh(
        tmp_path, capsys):
    train = load_tool('train')
    args = train.parse_args([DEMO, '--work-dir', str(tmp_path), '--resume'])
    cfg = train.build_config(args)
    assert (cfg.resume, cfg.load_from) == (False, None)
    said = capsys.readouterr().err
    assert said.count('no checkpoint to resume') == 1, said
    checkpoint = tmp_path / 'epoch_1.pth'
    torch.save({'meta': {}}, str(checkpoint))  # an empty file is damaged
    (tmp_path / 'last_checkpoint').write_text(str(checkpoint))
    cfg = train.build_config(args)
    assert (cfg.resume, cfg.load_from) == (True, str(checkpoint))


def test_a_refused_launch_says_why_once_before_training(tmp_path):
    child = tmp_path / 'ddp_fully_shard.py'
    child.write_text(f"_base_ = [{STRATEGY_CFG.format('fsdp2')!r}]\n"
                     "strategy = dict(type='DDPStrategy')\n")
    result = launch('dist_train.sh',
                    [str(child), '2', '--work-dir',
                     str(tmp_path / 'work')])
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert text.count('tools/train.py: error: strategy=DDPStrategy') == 1
    assert "Use strategy=dict(type='mmstats.FSDP2Strategy'" in text
    assert 'Epoch(train)' not in text
    # torchrun's Root Cause names it (torch's record on the entry point)
    root_cause = text.split('Root Cause')[1]
    assert 'error_file: <N/A>' not in root_cause
    assert 'LaunchRefused: strategy=DDPStrategy' in root_cause


def test_the_launcher_resolves_mmstats_fragments(tmp_path):
    """``_base_ = ['mmstats::_base_/strategies/X.py']`` through the
    launcher's ``build_config`` (the wheel's copy: test_packaging.py)."""
    train = load_tool('train')
    child = tmp_path / 'child.py'
    child.write_text(f"_base_ = [{DEMO!r}, "
                     "'mmstats::_base_/strategies/fsdp2.py']\n")
    cfg = train.build_config(train.parse_args([str(child)]))
    assert cfg.strategy.type == 'mmstats.FSDP2Strategy'
    assert cfg.runner_type == 'FlexibleRunner'


class _CountingConfig(dict):
    """A config that counts the reads of its ``strategy``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.strategy_reads = 0

    def get(self, key, default=None):
        self.strategy_reads += key == 'strategy'
        return super().get(key, default)

    def __getitem__(self, key):
        self.strategy_reads += key == 'strategy'
        return super().__getitem__(key)


def test_setup_launcher_reads_the_strategy_once(monkeypatch):
    from mmstats.launch import setup as launch_setup
    monkeypatch.setattr(launch_setup, 'GROUP_STRATEGIES', ())  # no group
    cfg = _CountingConfig(
        launcher='none',
        runner_type='FlexibleRunner',
        strategy=dict(type='mmstats.FSDPStrategy', state_dict_cfg='full'),
        resume=False)
    setup_launcher(cfg)
    assert cfg.strategy_reads == 1
