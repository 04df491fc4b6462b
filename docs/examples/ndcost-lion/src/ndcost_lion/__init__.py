"""An example third-party ndcost plugin.

It adds the Lion optimizer (Chen et al. 2023, "Symbolic Discovery of
Optimization Algorithms"), which keeps one momentum tensor per parameter, and
the NF4 storage format of QLoRA (4-bit codes, one fp32 absmax per block of 64).
After ``pip install`` both are usable by name::

    ndcost.Strategy(optimizer="lion")
    ndcost.accounting.training_bytes(..., optimizer="lion", ...)
    ndcost.accounting.storage_bytes("nf4", 4096)
"""
import ndcost
from ndcost.plugins.optimizers import Optimizer
from ndcost.plugins.storage import StorageFormat

LION = Optimizer(name="lion", states_per_parameter=1, description="Lion: one momentum tensor (sign update)")
NF4 = StorageFormat(name="nf4", bits_per_element=4, group_size=64, scale_bytes=4,
                    description="QLoRA NormalFloat4: two codes a byte, one fp32 absmax per 64 elements")


@ndcost.hookimpl
def ndcost_register(register):
    register("optimizer/lion", LION)
    register("storage/nf4", NF4)
