"""Optimizers by the number of state tensors they keep per parameter."""
from __future__ import annotations

import attrs

from ndcost.hookspecs import hookimpl


@attrs.frozen(kw_only=True)
class Optimizer:
    """An optimizer's persistent state: ``states_per_parameter`` tensors the shape of each parameter.

    ``step_temporaries_per_parameter`` is the parameter-sized scratch its step
    allocates and frees (a fused update's copies), in tensors a parameter:
    the step's transient peak, not kept state. 0 for the built-ins; declared
    rather than read with a default so that a reader sees every field the
    cost model uses (the ``optimizer/`` contract in ndcost.protocols).
    """

    name: str
    states_per_parameter: int
    step_temporaries_per_parameter: float = attrs.field(
        default=0.0, converter=float, validator=attrs.validators.ge(0.0))
    description: str = ""

    def state_elements(self, parameters: int) -> int:
        return self.states_per_parameter * parameters


BUILTIN = (
    Optimizer(name="sgd", states_per_parameter=0, description="plain SGD: no state (momentum-free)"),
    Optimizer(name="adagrad", states_per_parameter=1, description="AdaGrad: the sum of squared gradients"),
    Optimizer(name="adam", states_per_parameter=2, description="Adam: first and second moments"),
    Optimizer(name="adamw", states_per_parameter=2, description="AdamW: first and second moments"),
    # torch's foreach implementation (its default on CUDA without fused=True, torch/optim/adamw.py
    # _multi_tensor_adamw) takes the second moments' square roots for every parameter at once
    # (torch._foreach_sqrt): one state-sized temporary, measured with torch.profiler (tests/test_optimizers.py)
    Optimizer(name="adam_foreach", states_per_parameter=2, step_temporaries_per_parameter=1.0,
              description="Adam as torch's foreach implementation steps it: one state-sized temporary at the step"),
    Optimizer(name="adamw_foreach", states_per_parameter=2, step_temporaries_per_parameter=1.0,
              description="AdamW as torch's foreach implementation steps it (torch.optim.AdamW's default on CUDA "
                          "without fused=True): one state-sized temporary at the step"),
)


@hookimpl
def ndcost_register(register):
    for optimizer in BUILTIN:
        register(f"optimizer/{optimizer.name}", optimizer)
