"""Read back what an offline W&B run wrote: its ``run-<id>.wandb`` file
(wandb 0.30 ships no reader of it; ``wandb.sdk.internal.datastore`` is
gone).

The file (checked against wandb 0.30.0's offline runs, records spanning
blocks included): a 7-byte header (``:W&B``, the 2-byte magic ``0xBEE1``
little-endian, a 1-byte version, 0), then LevelDB's log format in 32 KiB
blocks counted from the file's start (the header fills the first 7 bytes
of the first block). A chunk is a 4-byte little-endian CRC (zlib's CRC-32,
unmasked, of its type byte and data: not LevelDB's masked CRC-32C; checked
here), a 2-byte little-endian data length, a 1-byte type
(1 FULL, 2 FIRST, 3 MIDDLE, 4 LAST) and the data; a block's last bytes,
too few for a chunk header (7 bytes), are zeros (LevelDB's rule, checked
here; no run checked had such a tail: wandb fills a tail of 7 bytes or
more with a FIRST chunk). Each reassembled record is a
``wandb.proto.wandb_internal_pb2.Record``.
"""
import glob
import json
import os.path as osp
import struct
import zlib
from typing import Any, Dict, List

HEADER = b':W&B' + struct.pack('<HB', 0xBEE1, 0)  # ident, magic, version
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: str) -> list:
    """Every ``Record`` of the ``.wandb`` file ``path``, in order; an
    AssertionError for anything that is not the format above."""
    from wandb.proto import wandb_internal_pb2
    with open(path, 'rb') as f:
        data = f.read()
    assert data[:len(HEADER)] == HEADER, \
        f'{path}: not a version-0 W&B run file ({data[:len(HEADER)]!r})'
    records, parts, pos = [], None, len(HEADER)
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:  # the block's zero padding
            assert data[pos:pos + left] == bytes(len(data[pos:pos + left]))
            pos += left
            continue
        crc, length, kind = struct.unpack('<IHB', data[pos:pos + CHUNK_HEADER])
        chunk = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        assert CHUNK_HEADER + length <= left and len(chunk) == length, \
            f'{path}: a chunk at byte {pos} runs past its block or the file'
        assert crc == zlib.crc32(bytes([kind]) + chunk), \
            f'{path}: CRC mismatch at byte {pos}'
        pos += CHUNK_HEADER + length
        if kind == FULL:
            assert parts is None
            records.append(chunk)
        elif kind == FIRST:
            assert parts is None
            parts = [chunk]
        elif kind in (MIDDLE, LAST):
            assert parts is not None, f'{path}: a lone chunk at byte {pos}'
            parts.append(chunk)
            if kind == LAST:
                records.append(b''.join(parts))
                parts = None
        else:
            raise AssertionError(f'{path}: chunk type {kind} at byte {pos}')
    assert parts is None, f'{path}: ends inside a record'
    out = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def run_file(wandb_dir: str) -> str:
    """The one offline run file under ``wandb_dir`` (``wandb.init``'s
    ``dir``): ``<wandb_dir>/wandb/offline-run-*/run-*.wandb``."""
    paths = glob.glob(
        osp.join(wandb_dir, 'wandb', 'offline-run-*', 'run-*.wandb'))
    assert len(paths) == 1, paths
    return paths[0]


def history(wandb_dir: str) -> List[Dict[str, Any]]:
    """The logged history of the offline run under ``wandb_dir``: one
    ``{key: value}`` per committed step (``_step``, ``_runtime`` and
    ``_timestamp`` included), values decoded from JSON. W&B splits a
    dict-like value (a histogram is ``{'_type': 'histogram', 'values':
    [...], 'bins': [...]}``) into items of nested keys; they are nested
    back here."""
    steps = []
    for record in read_records(run_file(wandb_dir)):
        if record.WhichOneof('record_type') != 'history':
            continue
        step: Dict[str, Any] = {}
        for item in record.history.item:
            *outer, last = list(item.nested_key) or [item.key]
            into = step
            for key in outer:
                into = into.setdefault(key, {})
            assert last not in into, f'{item} twice'
            into[last] = json.loads(item.value_json)
        steps.append(step)
    return steps
