"""tools/train.py and tools/test.py end their process group on every rank
(a barrier, then ``destroy_process_group``): a rank that exits with its gloo
group alive can abort at exit (``terminate called without an active
exception``, exit code -6) after a finished run."""
import importlib.util
import os.path as osp

import pytest
import torch.distributed as dist

from mmstats.launch import finish_distributed

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def load_tool(name: str):
    """tools/<name>.py as a module (not run as a script); the launchers
    ``train`` and ``test``: their code, :mod:`mmstats.tools.<name>`."""
    if name in ('train', 'test'):
        return importlib.import_module(f'mmstats.tools.{name}')
    spec = importlib.util.spec_from_file_location(
        f"mmstats_tool_{name.replace('/', '_')}",
        osp.join(ROOT, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeRunner:

    def __init__(self, events: list) -> None:
        self.events = events

    def register_hook(self, hook, priority=None) -> None:
        pass

    def train(self) -> None:
        self.events.append('train')

    def test(self) -> dict:
        self.events.append('test')
        return dict(accuracy=1.0)


@pytest.mark.parametrize('tool, argv', [('train', ['cfg.py']),
                                        ('test', ['cfg.py', 'ckpt.pth'])])
def test_tools_finish_the_process_group_after_the_run(monkeypatch, tool, argv):
    module = importlib.import_module(f'mmstats.tools.{tool}')
    events = []
    monkeypatch.setattr(module, 'build_config',
                        lambda args: dict(launcher='none'))
    monkeypatch.setattr(module, 'build_runner', lambda cfg: FakeRunner(events))
    if tool == 'train':
        monkeypatch.setattr(module, 'report', lambda runner, metrics: None)
    monkeypatch.setattr(module, 'finish_distributed',
                        lambda: events.append('finish'))
    module.main(argv)
    assert events == [tool, 'finish']


def test_finish_distributed_barriers_then_destroys_the_group(
        tmp_path, monkeypatch):
    calls = []
    barrier = dist.barrier
    monkeypatch.setattr(dist, 'barrier',
                        lambda *a, **k: calls.append('barrier') or barrier())
    finish_distributed()  # no group: nothing
    assert calls == [] and not dist.is_initialized()
    dist.init_process_group(
        'gloo', init_method=f'file://{tmp_path}/store', rank=0, world_size=1)
    try:
        finish_distributed()
        assert calls == ['barrier']
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
