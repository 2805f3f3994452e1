"""Small real-Runner configs of the demo for its tests (synthetic data, a
few iterations), and tools/train.py in a fresh interpreter."""
import os
import os.path as osp
import subprocess
import sys
import time

from mmengine.config import Config

from tests.helpers.without_deepspeed import env_without_deepspeed

PROJECT = osp.dirname(osp.dirname(osp.abspath(__file__)))
REPO = osp.dirname(osp.dirname(PROJECT))
EPOCH_CONFIG = osp.join(PROJECT, 'configs/demo/resnet-mini_1xb64_digits.py')
ITER_CONFIG = osp.join(PROJECT,
                       'configs/demo/resnet-mini_1xb64-iter_digits.py')
MAIN_CONFIG = osp.join(
    PROJECT, 'configs/demo/resnet-mini_1xb64-precise-bn-stats_digits.py')
RECORD_HOOK = 'tests.helpers.record_batches_hook'


def small_cfg(config: str = EPOCH_CONFIG,
              work_dir: str = '.',
              synthetic: bool = True,
              **overrides) -> Config:
    """A demo config made small: synthetic data, tiny model, quiet logs."""
    cfg = Config.fromfile(config)
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = f'test_{time.time_ns()}'
    if synthetic:
        for loader in (cfg.train_dataloader, cfg.val_dataloader):
            loader.dataset.type = 'SyntheticDigitsDataset'
            loader.dataset.num_samples = 160
        cfg.train_dataloader.batch_size = 16
        cfg.test_dataloader = cfg.val_dataloader
    cfg.model.backbone.stem_channels = 8
    cfg.model.backbone.stage_channels = (8, 16)
    cfg.default_hooks.logger.interval = 2
    cfg.merge_from_dict(overrides)
    return cfg


def recording_config(tmp_path,
                     base: str = EPOCH_CONFIG,
                     extra: str = '') -> str:
    """Write a config that inherits ``base`` and records every training
    batch with ``tests.helpers.record_batches_hook.RecordBatchesHook``."""
    path = osp.join(str(tmp_path), 'recording_config.py')
    with open(path, 'w') as f:
        f.write(f"_base_ = [{base!r}]\n"
                f"custom_imports = dict(imports=[{RECORD_HOOK!r}])\n"
                "custom_hooks = [dict(type='RecordBatchesHook')]\n" + extra)
    return path


def demo_env(env: dict = None) -> dict:
    """The environment of the demo's tools as ``make demo`` installs them:
    the repository importable, DeepSpeed absent
    (:func:`~tests.helpers.without_deepspeed.env_without_deepspeed`)."""
    env = dict(os.environ if env is None else env)
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (REPO, env.get('PYTHONPATH')) if p)
    return env_without_deepspeed(env)


def run_train(*args: str, env: dict = None, timeout: float = 300):
    """Run tools/train.py in a fresh interpreter (the demo's environment,
    :func:`demo_env`); return CompletedProcess."""
    env = demo_env(env)
    return subprocess.run(
        [sys.executable,
         osp.join(REPO, 'tools/train.py'), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout)
