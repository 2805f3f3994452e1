# The demo (precise BN + all-rank statistics) under FlexibleRunner with
# DeepSpeed ZeRO-3, the strategy fragment inherited as is
# (`pip install -e '.[deepspeed]'` first):
#   bash tools/dist_train.sh \
#       projects/digits_demo/configs/strategies/resnet-mini_zero3_digits.py 2
_base_ = [
    '../demo/resnet-mini_1xb64-precise-bn-stats_digits.py',
    '../../../../configs/_base_/strategies/deepspeed_zero3.py'
]
