# Copyright (c) mmstats contributors. All rights reserved.
"""What is wrong with a checkpoint, found before anything loads it.

:func:`checkpoint_problem` reads only sizes, names and the small index
files (a zip's central directory, DCP's ``.metadata``, the markers), never
the tensors: a few milliseconds for a checkpoint of any size. It returns
one sentence naming what is wrong, or None:

- a file: missing, empty, or cut short (``torch.save`` writes a zip whose
  directory comes last: a cut file has none; its size is named);
- a directory written by :class:`mmstats.CheckpointHook`
  (:data:`~.files.COMPLETE`): every file it lists, present and whole;
- a sharded directory of an older mmstats (``mmstats_sharded.json``):
  every file DCP's ``.metadata`` points into;
- a DeepSpeed directory without the marker: rank 0's
  ``mp_rank_00_model_states.pt`` and every rank's optimizer states;
- any other directory: no completion marker.

:func:`deepspeed_world_size` is the number of processes a DeepSpeed
checkpoint was written by (it resumes on that number only).
"""
import glob
import json
import os.path as osp
import re
import zipfile
from typing import List, Optional

from .files import COMPLETE, PARTIAL

__all__ = ['checkpoint_problem', 'deepspeed_world_size']

#: the marker of mmstats' sharded format (``mmstats.strategies``)
SHARDED = 'mmstats_sharded.json'
#: DeepSpeed's file of the model (rank 0 of model parallelism)
DS_MODEL = 'mp_rank_00_model_states.pt'
_DS_OPTIM = re.compile(r'(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states'
                       r'\.pt$')
#: ZeRO-3's model states, one file per rank (no ``mp_rank_00_...``)
_DS_MODEL3 = re.compile(r'zero_pp_rank_(\d+)_mp_rank_\d+_model_states\.pt$')


def _size(nbytes: int) -> str:
    return f'{nbytes:,} bytes'


def _file_problem(path: str) -> Optional[str]:
    size = osp.getsize(path)
    if size == 0:
        return 'is empty (0 bytes)'
    with open(path, 'rb') as f:
        head = f.read(4)
    if head[:2] != b'PK':  # torch's legacy format: a pickle
        return None if head[:1] == b'\x80' else (
            f'is not a torch checkpoint ({_size(size)}, neither a zip nor a '
            'pickle)')
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError):
        return (f'is cut short: {_size(size)}, and the zip directory '
                'torch.save writes at its end is missing')
    end = max((e.header_offset + e.compress_size for e in entries), default=0)
    if end > size:
        return f'is cut short: {_size(size)} of at least {_size(end)}'
    return None


def _listed_problem(path: str, listed: dict) -> Optional[str]:
    """Files of the marker missing or smaller than when they were written."""
    return _files_problem(path, listed, 'of')


def _files_problem(path: str, sizes: dict, bound: str) -> Optional[str]:
    """Files of ``sizes`` (name: bytes) missing under ``path`` or smaller
    than their size (``bound``: ``'of'`` an exact size, ``'of at least'``
    an end the index points to)."""
    missing = [name for name in sizes if not osp.isfile(osp.join(path, name))]
    if missing:
        return f'lacks {_describe(missing)}'
    short = [
        f'{name} ({_size(osp.getsize(osp.join(path, name)))} {bound} '
        f'{_size(size)})' for name, size in sizes.items()
        if osp.getsize(osp.join(path, name)) < size
    ]
    return f'has files cut short: {", ".join(short)}' if short else None


def _describe(names: List[str]) -> str:
    """``rank 1's zero_pp_rank_1_..._optim_states.pt`` where a name says
    whose it is."""
    out = []
    for name in sorted(names):
        found = _DS_OPTIM.search(name) or re.search(r'__(\d+)_\d+\.distcp$',
                                                    name)
        out.append(f"rank {found.group(1)}'s {name}" if found else name)
    return ', '.join(out)


def _sharded_problem(path: str) -> Optional[str]:
    metadata = osp.join(path, '.metadata')
    if not osp.isfile(metadata):
        return 'lacks .metadata (the index torch.distributed.checkpoint ' \
               'writes)'
    try:
        from torch.distributed.checkpoint import FileSystemReader
        storage = FileSystemReader(path).read_metadata().storage_data
    except Exception as exc:  # a cut .metadata: unpickling fails
        return f'has an unreadable .metadata ({type(exc).__name__})'
    ends: dict = {}
    for info in storage.values():
        name = info.relative_path
        ends[name] = max(ends.get(name, 0), info.offset + info.length)
    return _files_problem(path, ends, 'of at least')


def _deepspeed_ranks(path: str, pattern: re.Pattern = _DS_OPTIM) -> List[int]:
    return sorted(
        int(found.group(1))
        for found in map(pattern.search, glob.glob(osp.join(path, '*')))
        if found)


def _is_deepspeed(path: str) -> bool:
    return osp.isdir(path) and bool(
        glob.glob(osp.join(path, '*model_states.pt')))


def _deepspeed_problem(path: str) -> Optional[str]:
    """A DeepSpeed directory without mmstats' marker: rank 0's model states
    (``mp_rank_00_...``, ZeRO-3: every rank's ``zero_pp_rank_R_...``) and
    every rank's optimizer states, up to the highest rank found."""
    ranks = _deepspeed_ranks(path)
    models = _deepspeed_ranks(path, _DS_MODEL3)
    if not osp.isfile(osp.join(path, DS_MODEL)) and not models:
        return f'lacks {DS_MODEL} (rank 0\'s model states)'
    world = max(ranks + models, default=-1) + 1
    for what, found in (('optimizer', ranks), ('model', models)):
        if what == 'model' and not models:
            continue
        missing = sorted(set(range(world)) - set(found))
        if missing:
            return (f'lacks the {what} states of rank(s) ' +
                    ', '.join(map(str, missing)))
    return None


def _read_marker(path: str) -> Optional[dict]:
    try:
        with open(osp.join(path, COMPLETE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def checkpoint_problem(path: str) -> Optional[str]:
    """What is wrong with the checkpoint at ``path``, as the end of a
    sentence that starts with the path; None when it looks whole.

    Args:
        path (str): A checkpoint file or directory.

    Returns:
        str | None: E.g. ``'is cut short: 1,024 bytes, and the zip
        directory torch.save writes at its end is missing'``.

    Example:
        >>> checkpoint_problem('/nonexistent/epoch_1.pth')
        'does not exist'
    """
    if path.endswith(PARTIAL):
        return 'is a checkpoint whose save never finished (.partial)'
    if not osp.exists(path):
        return 'does not exist'
    if osp.isfile(path):
        return _file_problem(path)
    if osp.isfile(osp.join(path, COMPLETE)):
        marker = _read_marker(path)
        if marker is None or not isinstance(marker.get('files'), dict):
            return f'has an unreadable {COMPLETE}'
        return _listed_problem(path, marker['files'])
    if osp.isfile(osp.join(path, SHARDED)):
        return _sharded_problem(path)
    if _is_deepspeed(path):
        return _deepspeed_problem(path)
    return (f'is a directory without a completion marker ({COMPLETE} or '
            f'{SHARDED}): its save did not finish, or it is no checkpoint')


def deepspeed_world_size(path: str) -> Optional[int]:
    """The number of processes that wrote the DeepSpeed checkpoint
    ``path`` (its marker's, else its ranks' optimizer files); None for
    another format.

    Example:
        >>> deepspeed_world_size('/nonexistent') is None
        True
    """
    if not _is_deepspeed(path):
        return None
    marker = _read_marker(path)
    if marker is not None and isinstance(marker.get('world_size'), int):
        return marker['world_size']
    ranks = _deepspeed_ranks(path)
    return len(ranks) or None
