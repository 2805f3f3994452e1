# The demo: a small ConvModule ResNet on the embedded digits, epoch-based.
_base_ = [
    '../_base_/datasets/digits.py', '../_base_/models/resnet-mini.py',
    '../_base_/schedules/digits_epoch.py', '../_base_/default_runtime.py'
]
