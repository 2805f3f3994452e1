"""The parts ThroughputHook calls, without a Runner: the FLOP counter
(against a count by hand and torch's ``FlopCounterMode``), the peak
table, the rows of a batch and the memory reader (the figures themselves:
``test_figures.py``)."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mmstats.throughput import (IterationFlops, MemoryReader, batch_rows,
                                peak_flops)
from tests.helpers.toy import ToyBNModel, toy_flops_per_sample


def test_flops_of_the_toy_model_by_hand_and_by_torch():
    model = ToyBNModel()
    inputs = torch.randn(6, 1, 8, 8)
    labels = torch.arange(6)
    counter = IterationFlops()
    counter.start()
    model(inputs, dict(gt_label=labels), mode='loss')['loss'].backward()
    counter.stop()
    assert counter.total == 6 * toy_flops_per_sample()
    assert counter.by_kind == {'fp32': 6 * toy_flops_per_sample()}
    with FlopCounterMode(display=False) as reference:
        model(inputs, dict(gt_label=labels), mode='loss')['loss'].backward()
    assert reference.get_total_flops() == counter.total


def test_peak_table_and_mixed_formats():
    assert peak_flops('NVIDIA H100 PCIe', 'bf16') == 756e12
    assert peak_flops('NVIDIA H100 NVL', 'bf16') == 835e12
    assert peak_flops('NVIDIA H100 80GB HBM3', 'tf32') == 494.7e12
    assert peak_flops('NVIDIA L40S', 'bf16') == 362.05e12
    assert peak_flops('NVIDIA L4', 'bf16') == 121e12
    assert peak_flops('NVIDIA A10', 'fp32') == 31.2e12
    assert peak_flops('Tesla V100-SXM2-16GB', 'bf16') is None  # none
    counter = IterationFlops()
    counter.by_kind = dict(bf16=989.4e12, fp32=66.9e12)  # 1 s each
    assert counter.peak('NVIDIA H100 80GB HBM3') == pytest.approx(
        (989.4e12 + 66.9e12) / 2)
    counter.by_kind = dict(bf16=1, other=1)
    assert counter.peak('NVIDIA H100 80GB HBM3') is None


def test_batch_rows_of_the_usual_batches():
    assert batch_rows(dict(inputs=torch.zeros(3, 2))) == 3
    assert batch_rows(dict(inputs=[torch.zeros(2)] * 5, data_samples=[])) == 5
    assert batch_rows(dict(inputs=dict(img=torch.zeros(4, 1)))) == 4
    assert batch_rows([torch.zeros(7, 1), torch.zeros(7)]) == 7
    assert batch_rows(dict(img=torch.zeros(2, 1))) == 2  # no 'inputs'
    assert batch_rows({}) is None
    assert batch_rows(None) is None
    assert batch_rows(dict(inputs=torch.tensor(1.))) is None


def test_cpu_memory_is_the_peak_rss_of_the_process():
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    read = MemoryReader(torch.device('cpu')).read()['max_rss']
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert before <= read <= after
