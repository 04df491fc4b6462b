"""A second reading of OLMo-2 registered as family/olmo2 with override=True: it wins over ndcost-olmo2."""
import attrs

import ndcost
from ndcost.models import Family
from ndcost.plugins.families.llama import LLAMA


class Olmo2Override(Family):
    """OLMo-2 read as a Llama (wrongly: no QK-norm), under its own name."""

    name = "olmo2_override"
    model_types = ("olmo2",)

    def spec(self, config, name):
        return attrs.evolve(LLAMA.spec(config, name), family=self.name, model_type="olmo2")

    def layer_parameters(self, spec, kind):
        return LLAMA.layer_parameters(spec, kind)


@ndcost.hookimpl
def ndcost_register(register):
    register("family/olmo2", Olmo2Override(), override=True)
