# The demo (precise BN + all-rank statistics) under FlexibleRunner with the
# fsdp strategy fragment, inherited as is:
#   bash tools/dist_train.sh \
#       projects/digits_demo/configs/strategies/resnet-mini_fsdp_digits.py 2
_base_ = [
    '../demo/resnet-mini_1xb64-precise-bn-stats_digits.py',
    '../../../../configs/_base_/strategies/fsdp.py'
]
