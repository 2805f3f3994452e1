"""What is wrong with a checkpoint, named before anything loads it, and the
one ``--resume`` takes (``mmstats.checkpoints``): real files of each
format, damaged the ways a crash or a copy damages them."""
import json
import os
import os.path as osp
import time

import pytest
import torch

from mmstats.checkpoints import (COMPLETE, checkpoint_problem,
                                 deepspeed_world_size, resume_choice,
                                 write_last_checkpoint)
from mmstats.checkpoints.files import publish, write_marker
from mmstats.checkpoints.together import local_problem
from tests.helpers.torch_versions import needs_torch


def _file(path) -> str:
    torch.save({'state_dict': {'w': torch.arange(4000.)}}, str(path))
    return str(path)


def _cut(path: str, keep: float = 0.5) -> int:
    size = osp.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(int(size * keep))
    return int(size * keep)


def test_a_file_cut_short_is_named_with_its_size(tmp_path):
    path = _file(tmp_path / 'epoch_2.pth')
    assert checkpoint_problem(path) is None
    kept = _cut(path)
    assert checkpoint_problem(path) == (
        f'is cut short: {kept:,} bytes, and the zip directory torch.save '
        'writes at its end is missing')
    _cut(path, 0)
    assert checkpoint_problem(path) == 'is empty (0 bytes)'
    assert checkpoint_problem(str(tmp_path / 'nope.pth')) == 'does not exist'
    assert 'never finished' in checkpoint_problem(path + '.partial')


def _deepspeed_dir(path, ranks=2) -> str:
    os.makedirs(path)
    torch.save({'module': None}, osp.join(path, 'mp_rank_00_model_states.pt'))
    for rank in range(ranks):
        torch.save({'r': rank},
                   osp.join(path,
                            f'zero_pp_rank_{rank}_mp_rank_00_optim_states.pt'))
    return str(path)


def test_a_deepspeed_directory_missing_a_ranks_file_names_the_rank(tmp_path):
    path = _deepspeed_dir(tmp_path / 'epoch_2.pth.partial')
    final = str(tmp_path / 'epoch_2.pth')
    assert publish(path, final, 2) is None  # marker, then the rename
    assert not osp.exists(path) and checkpoint_problem(final) is None
    assert deepspeed_world_size(final) == 2
    name = 'zero_pp_rank_1_mp_rank_00_optim_states.pt'
    os.remove(osp.join(final, name))
    assert checkpoint_problem(final) == f"lacks rank 1's {name}"
    # another file cut short: its size and the size written
    model = osp.join(final, 'mp_rank_00_model_states.pt')
    whole = osp.getsize(model)
    _cut(model)
    _deepspeed_dir(tmp_path / 'again')  # restore rank 1 elsewhere
    assert 'lacks' in checkpoint_problem(final)
    os.rename(osp.join(tmp_path, 'again', name), osp.join(final, name))
    assert checkpoint_problem(final) == (
        'has files cut short: mp_rank_00_model_states.pt '
        f'({whole // 2:,} bytes of {whole:,} bytes)')


def test_a_deepspeed_directory_without_marker_is_checked_by_its_files(
        tmp_path):
    """One written by mmengine's own hook: rank 0's model file and every
    rank up to the last one's optimizer states."""
    path = _deepspeed_dir(tmp_path / 'epoch_1.pth', ranks=3)
    assert checkpoint_problem(path) is None
    assert deepspeed_world_size(path) == 3
    os.remove(osp.join(path, 'zero_pp_rank_1_mp_rank_00_optim_states.pt'))
    assert checkpoint_problem(path) == \
        'lacks the optimizer states of rank(s) 1'


def test_a_zero3_directory_without_marker_is_checked_by_its_files(tmp_path):
    """ZeRO-3 writes every rank's model states (no ``mp_rank_00_...``)."""
    path = str(tmp_path / 'epoch_1.pth')
    os.makedirs(path)
    for rank in range(2):
        for kind in ('model', 'optim'):
            torch.save({},
                       osp.join(
                           path,
                           f'zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt'))
    assert checkpoint_problem(path) is None
    assert deepspeed_world_size(path) == 2
    assert 'written by 2 processes, and this run has 1' in local_problem(
        path, resume=True, world_size=1)
    os.remove(osp.join(path, 'zero_pp_rank_0_mp_rank_00_model_states.pt'))
    assert checkpoint_problem(path) == 'lacks the model states of rank(s) 0'


def test_a_deepspeed_resume_on_another_world_size_names_both(tmp_path):
    path = _deepspeed_dir(tmp_path / 'epoch_1.pth')
    write_marker(path, 2)
    line = local_problem(path, resume=True, world_size=1)
    assert 'written by 2 processes, and this run has 1' in line
    assert 'tools/model_converters/consolidate_checkpoint.py' in line
    assert local_problem(path, resume=False, world_size=1) is None
    assert local_problem(path, resume=True, world_size=2) is None


@pytest.mark.filterwarnings('ignore:torch.distributed is disabled')
@needs_torch('2.2', 'torch.distributed.checkpoint.save')
def test_a_sharded_directory_missing_or_cutting_a_shard(tmp_path):
    """A DCP directory (one process writes one ``__0_0.distcp``) named by
    the sharded format's marker; the files its ``.metadata`` points into
    are checked."""
    import torch.distributed.checkpoint as dcp
    path = str(tmp_path / 'epoch_1.pth')
    dcp.save({'state_dict': {'w': torch.arange(5000.)}}, checkpoint_id=path)
    with open(osp.join(path, 'mmstats_sharded.json'), 'w') as f:
        json.dump({'format': 'torch.distributed.checkpoint'}, f)
    assert checkpoint_problem(path) is None
    shard = [n for n in os.listdir(path) if n.endswith('.distcp')][0]
    whole = osp.getsize(osp.join(path, shard))
    _cut(osp.join(path, shard))
    problem = checkpoint_problem(path)
    assert problem.startswith(f'has files cut short: {shard} '
                              f'({whole // 2:,} bytes of at least')
    os.remove(osp.join(path, shard))
    assert checkpoint_problem(path) == f"lacks rank 0's {shard}"
    os.remove(osp.join(path, 'mmstats_sharded.json'))
    assert 'without a completion marker' in checkpoint_problem(path)


def _complete(work_dir, name, age):
    path = _file(osp.join(work_dir, name))
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_resume_takes_the_newest_complete_checkpoint_and_says_why(tmp_path):
    work = str(tmp_path)
    assert resume_choice(work) == (None, None)  # a new run: nothing said
    first = _complete(work, 'epoch_1.pth', 30)
    second = _complete(work, 'epoch_2.pth', 20)
    _file(osp.join(work, 'epoch_3.pth.partial'))  # the save a crash cut
    write_last_checkpoint(work, second)
    assert resume_choice(work) == (second, None)
    _cut(second)  # last_checkpoint names a damaged one
    path, why = resume_choice(work)
    assert path == first
    assert why.startswith(f'last_checkpoint names {second}, which is cut '
                          'short: ')
    assert why.endswith(f': resuming the newest complete checkpoint, {first}')
    os.remove(second)  # or a missing one (max_keep_ckpts removed it)
    assert resume_choice(work) == (
        first, f'last_checkpoint names {second}, which does not exist: '
        f'resuming the newest complete checkpoint, {first}')
    _cut(first)
    path, why = resume_choice(work)
    assert path is None and why.endswith(
        'and no other checkpoint there is complete: training from scratch')


def test_the_marker_lists_every_file_but_itself(tmp_path):
    path = _deepspeed_dir(tmp_path / 'd')
    write_marker(path, 2)
    with open(osp.join(path, COMPLETE)) as f:
        marker = json.load(f)
    assert marker['world_size'] == 2
    assert sorted(marker['files']) == sorted(
        n for n in os.listdir(path) if n != COMPLETE)


@pytest.mark.parametrize('bad', ['SIGKILL', 'NOPE'])
def test_stop_signals_are_checked(bad):
    from mmstats.checkpoints.stop import signal_numbers
    with pytest.raises(ValueError, match='stop_signals'):
        signal_numbers([bad])


def test_a_second_signal_is_counted_and_changes_nothing():
    import signal

    from mmstats.checkpoints import StopRequest
    before = signal.getsignal(signal.SIGUSR1)
    request = StopRequest(['USR1'])
    assert request.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert (request.signal_name, request.count) == ('SIGUSR1', 2)
    finally:
        request.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is before
