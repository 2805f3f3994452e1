"""Every rank decides together (2 real gloo ranks, DDP Runners): a signal
to rank 1 only stops both at the same iteration, both save, and the run
resumed from that checkpoint continues exactly like the uninterrupted one
on every rank; a checkpoint damaged where rank 1 sees it is refused on
both ranks, with the same line."""
import os
import os.path as osp

import pytest
import torch
from mmengine.runner import FlexibleRunner, Runner

from mmstats.checkpoints import Preempted, refuse_damaged
from mmstats.launch import LaunchRefused, allow_mmengine_checkpoints
from tests.helpers.dist import run_distributed
from tests.helpers.runner import clear_mmengine_singletons, gloo_launch
from tests.test_checkpoints.test_checkpoint_hook import RecordHook, _cfg


class RankOneSignal(RecordHook):
    """RecordHook whose signal goes to rank 1 only."""

    def __init__(self, rank, **where) -> None:
        super().__init__(**(where if rank == 1 else {}))


def _train(rank, world_size, kind, work_dir, where=None, resume=None):
    clear_mmengine_singletons()
    allow_mmengine_checkpoints()
    cfg = gloo_launch(_cfg(work_dir, True, interval=100))
    if kind == 'flexible':  # its save writes its own epoch/iter into meta
        cfg.runner_type = 'FlexibleRunner'
        cfg.strategy = dict(
            type='DDPStrategy', model_wrapper=cfg.pop('model_wrapper_cfg'))
    if resume is not None:
        cfg.resume, cfg.load_from = True, resume
    runner = (FlexibleRunner if kind == 'flexible' else Runner).from_cfg(cfg)
    record = RankOneSignal(rank, **(where or {}))
    runner.register_hook(record)
    stop = None
    try:
        runner.train()
    except Preempted as exc:
        stop = (exc.signal_name, exc.checkpoint, runner.iter)
    weights = {k: v.clone() for k, v in runner.model.state_dict().items()}
    runner.message_hub.runtime_info.clear()
    clear_mmengine_singletons()
    return record.losses, weights, stop


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    return {
        kind: run_distributed(_train, 2, kind,
                              str(tmp_path_factory.mktemp(kind)))
        for kind in ('runner', 'flexible')
    }


# a Runner, and a FlexibleRunner (whose save writes its own epoch/iter into
# meta, whatever the hook gives it)
@pytest.mark.parametrize(
    'kind, where', [('runner', dict(signal_at=7)),
                    ('flexible', dict(signal_at=7)),
                    ('flexible', dict(signal_in_val=1))],
    ids=['runner_mid_epoch', 'flexible_mid_epoch', 'flexible_in_val'])
def test_a_signal_to_rank_1_stops_both_and_resumes_exactly(
        tmp_path, uninterrupted, kind, where):
    work = str(tmp_path)
    stopped = run_distributed(_train, 2, kind, work, where, timeout=60)
    trained = where.get('signal_at', 5)  # validation 1: after 5 (2 ranks)
    path = osp.join(work, f'iter_{trained}_preempted.pth')
    assert [s for _, _, s in stopped] == [
        ('a signal to another rank', path, trained - ('signal_at' in where)),
        ('SIGUSR1', path, trained - ('signal_at' in where))
    ]
    assert osp.isfile(path) and not osp.exists(path + '.partial')
    resumed = run_distributed(_train, 2, kind, work, None, path, timeout=60)
    for rank in range(2):
        losses, weights, stop = resumed[rank]
        full_losses, full_weights, _ = uninterrupted[kind][rank]
        assert stop is None
        assert sorted(losses) == list(range(trained + 1, 16))
        assert all(losses[i] == full_losses[i] for i in losses), rank
        assert all(torch.equal(weights[k], full_weights[k])
                   for k in weights), rank


def _refuse(rank, world_size, paths):
    try:
        refuse_damaged(paths[rank])
    except LaunchRefused as exc:
        return str(exc)
    return None


def test_damage_seen_by_one_rank_is_refused_on_every_rank(tmp_path):
    good = str(tmp_path / 'epoch_1.pth')
    torch.save({'state_dict': {'w': torch.ones(1000)}}, good)
    assert run_distributed(_refuse, 2, [good, good]) == [None, None]
    cut = str(tmp_path / 'cut.pth')
    with open(good, 'rb') as f, open(cut, 'wb') as g:
        g.write(f.read()[:2000])
    lines = run_distributed(_refuse, 2, [good, cut])
    assert lines[0] == lines[1] == (
        f'checkpoint {cut} is cut short: 2,000 bytes, and the zip directory '
        'torch.save writes at its end is missing (seen by rank 1)')
    assert os.path.getsize(cut) == 2000
