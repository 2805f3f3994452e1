"""Marks for tests of features that need a newer torch than the oldest
mmstats supports (``mmstats/utils/torch_compat.py``, ``docs/compat.md``).

Each skip names the torch it needs and why, so the version matrix's
table (``make test-matrix``) lists the reason beside the count.
"""
import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

import pytest

from mmstats.utils.torch_compat import COMPILED_OPS, torch_at_least

#: the two lines the linker writes when DeepSpeed's import probes its
#: async-I/O op on a machine without libaio (nothing the suite uses)
AIO_PROBE = re.compile(r'cannot find -laio|^collect2: error: ld returned')


def needs_torch(version: str, why: str) -> pytest.MarkDecorator:
    """Skip where the installed torch is older than ``version``."""
    return pytest.mark.skipif(
        not torch_at_least(version), reason=f'needs torch >= {version}: {why}')


@contextlib.contextmanager
def without_the_aio_probe() -> Iterator[None]:
    """File descriptor 2 through a temporary file, passed on without the
    linker's lines of DeepSpeed's libaio probe. ``import deepspeed`` links
    a test program against libaio (``AsyncIOBuilder.is_compatible``);
    DeepSpeed silences it by redirecting ``sys.stderr.fileno()``, which
    under pytest's capture is not descriptor 2, so the linker's error
    reached the terminal after pytest's summary of a green run."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors='replace').splitlines(True)
            kept = ''.join(ln for ln in lines if not AIO_PROBE.search(ln))
            if kept:
                sys.stderr.write(kept)


def _deepspeed_imports() -> tuple:
    try:
        with without_the_aio_probe():
            import deepspeed  # noqa: F401
    except Exception as exc:  # DeepSpeed raises ValueError on old torch
        return False, f'{type(exc).__name__}: {str(exc)[:80]}'
    return True, ''


#: whether DeepSpeed imports here, and why not (not installed, or a torch
#: the installed DeepSpeed does not support: requirements/deepspeed.txt)
DEEPSPEED, NO_DEEPSPEED_WHY = _deepspeed_imports()
#: DeepSpeed tests
NEEDS_DEEPSPEED = pytest.mark.skipif(
    not DEEPSPEED,
    reason=f'needs a DeepSpeed that imports here ({NO_DEEPSPEED_WHY})')

#: torch.compile tests: mmstats' custom ops inside compiled graphs
#: (mmstats.utils.torch_compat.COMPILED_OPS)
COMPILE = needs_torch(COMPILED_OPS, 'mmstats ops inside torch.compile')
#: AMP tests on CPU: torch.amp.GradScaler('cpu')
CPU_GRAD_SCALER = needs_torch('2.3', "torch.amp.GradScaler('cpu')")
#: CPU float16 aminmax (torch 2.1 computes it in float32, 2 more ops)
HALF_AMINMAX = needs_torch('2.2', 'CPU float16 aminmax (ATen op counts)')
#: FSDP2 (fully_shard), mmstats.FullyShard, on CPU: torch 2.4's
#: fully_shard calls CUDA (measured; mmstats takes it from 2.4 on, for GPUs)
FSDP2 = needs_torch('2.6', "FSDP2 on CPU (torch 2.4's fully_shard calls CUDA)")
#: the checkpoint state-dict API of mmstats' sharded strategies
STATE_DICT_API = needs_torch('2.2', 'torch.distributed.checkpoint.state_dict')
#: FSDP1 under the hooks: torch 2.1's FSDP fails its lazy init in a
#: forward under no_grad before the first training step
FSDP1 = needs_torch('2.2', "FSDP1 (torch 2.1's lazy init)")

#: the tests of features an older torch lacks, by node id (a substring),
#: marked in tests/conftest.py: every skip names the torch it needs
BY_NODE_ID = (
    ('tests/test_stats/test_report_compile.py::', COMPILE),
    ('tests/test_stats/test_report_compile_dist.py::', COMPILE),
    ('tests/test_stats/test_report_in_graph.py::', COMPILE),
    ('test_module_stats_hook.py::test_compile_', COMPILE),
    ('test_module_stats_hook.py::test_amp_overflow_and_huge_loss_scale[True]',
     COMPILE),
    ('test_module_stats_hook.py::test_amp_overflow_and_huge_loss_scale',
     CPU_GRAD_SCALER),
    ('test_nonfinite_origin.py::test_watch_finds_the_planted_nan[dynamo]',
     COMPILE),
    ('test_nonfinite_origin.py::test_watch_finds_the_planted_nan[inductor]',
     COMPILE),
    ('test_nonfinite_origin.py::test_the_watch_adds_no_graph', COMPILE),
    ('test_nonfinite_origin_dist.py::test_two_ranks_raise_the_same_text['
     'dynamo]', COMPILE),
    ('test_throughput_runners.py::test_compiled_training_stays_compiled',
     COMPILE),
    ('-compile]', COMPILE),
    ('[fsdp2', FSDP2),
    ('-fsdp2', FSDP2),
    ('test_sharded_checkpointing.py::test_fsdp2', FSDP2),
    ('test_sharded_checkpointing.py::test_a_rank_shard', FSDP2),
    ('[fsdp', FSDP1),
)
