"""The built-in optimizers' step temporaries, beside torch's own optimizers stepping on the CPU.

torch.profiler's memory timeline (every tensor made and freed) gives the bytes a step holds above what was held
before it; the figure is device-independent (the same ops allocate the same outputs on CUDA). torch's foreach
AdamW (its default on CUDA without ``fused=True``) makes one state-sized temporary for every parameter at once;
the fused one none. torchtitan's ``[optimizer] implementation`` (and its 2024 ``fused``) say which it runs.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from _helpers import file_variant, ndcost  # noqa: F401  (the installed package first)

import ndcost as nd
from ndcost import manager
from ndcost.errors import InvalidValue
from ndcost.trainers import from_config, to_config

CONFIGS = Path(__file__).parent / "data" / "configs" / "torchtitan"


def _step_bytes(**kwargs) -> tuple:
    """(bytes a second AdamW step holds above what was held before it at its peak, the parameters) for two
    fp32 and two bf16 weights (states in the parameters' dtype), torch's AdamW with *kwargs*."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    peaks = []
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(256, 512, dtype=dtype)),
                  torch.nn.Parameter(torch.randn(512, 128, dtype=dtype))]
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer = torch.optim.AdamW(params, lr=1e-3, **kwargs)
        optimizer.step()  # the states made
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            optimizer.step()
        held = peak = 0
        for _, action, (key, _), size in prof._memory_profile().timeline:
            if key is not None and key.device.type == "cpu":
                held += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
                peak = max(peak, held)
        peaks.append(peak)
    return tuple(peaks), 256 * 512 + 512 * 128


def test_foreach_adamw_makes_one_state_sized_temporary():
    scalars = 64  # the step counts' few bytes beside the temporaries
    (fp32, bf16), parameters = _step_bytes(foreach=True)
    # torch._foreach_sqrt of the second moments
    assert 4 * parameters <= fp32 < 4 * parameters + scalars and 2 * parameters <= bf16 < 2 * parameters + scalars
    (fp32, bf16), _ = _step_bytes(fused=True)
    assert fp32 < scalars and bf16 < scalars
    registry = manager.registry()
    assert registry.get("optimizer/adamw_foreach").step_temporaries_per_parameter == 1.0
    assert registry.get("optimizer/adamw").step_temporaries_per_parameter == 0.0


def test_the_step_holds_it_beside_the_states():
    # Llama-3.1-8B over 4 FSDP ranks at a short sequence: the step its peak; the foreach step's temporary is the
    # shard's elements (8,030,261,248 / 4) in the states' dtype
    model = nd.resolve("llama-3.1-8b", census="off")
    base = "fsdp=4,seq=128,param_dtype=fp32,compute_dtype=bf16"
    fused, foreach = (model.evaluate(f"{base},optimizer={name}") for name in ("adamw", "adamw_foreach"))
    assert foreach.stages[0].provenance["moment"] == "optimizer step"
    assert foreach.stages[0].bytes_by_category["working"] == 4 * 8_030_261_248 // 4
    assert foreach.peak_bytes > fused.peak_bytes


@pytest.mark.parametrize("lines, optimizer", [
    ('name = "AdamW"\nimplementation = "foreach"', "adamw_foreach"),
    ('name = "AdamW"\nimplementation = "fused"', "adamw"),
    ('name = "Adam"\nfused = false', "adam_foreach"),  # torchtitan of 2024: foreach = not fused
    ('name = "AdamW"\nfused = true', "adamw"),
    ('name = "AdamW"', "adamw"),  # torchtitan's default: "fused"
])
def test_torchtitan_says_which_implementation(tmp_path, lines, optimizer):
    path = file_variant(CONFIGS / "llama3_8b.toml", 'name = "AdamW"', lines, tmp_path / "job.toml")
    config = from_config("torchtitan", path, devices=8)
    assert config.strategy.optimizer == optimizer
    assert "[optimizer] implementation" not in config.ignored_fields and "[optimizer] fused" not in config.ignored_fields
    written = to_config("torchtitan", config.strategy, model="llama-3.1-8b", global_batch=config.global_batch)
    assert f'implementation = "{"foreach" if optimizer.endswith("_foreach") else "fused"}"' in written


@pytest.mark.parametrize("implementation, words", [("for-loop", "'for-loop' is not priced"),
                                                    ("fusedd", "'fusedd' is not one of torchtitan's")])
def test_torchtitans_for_loop_and_unknown_implementations_are_refused(tmp_path, implementation, words):
    path = file_variant(CONFIGS / "llama3_8b.toml", 'name = "AdamW"',
                        f'name = "AdamW"\nimplementation = "{implementation}"', tmp_path / "job.toml")
    with pytest.raises(InvalidValue, match=words):
        from_config("torchtitan", path, devices=8)




def test_a_foreach_optimizers_fused_twin_is_one_change():
    import attrs

    from ndcost.search import _one_change, one_change_fits

    # Llama-3.1-8B over 4 FSDP ranks on a device whose memory lies between the two peaks: the foreach step's
    # 8 GB temporary alone keeps it from fitting
    model = nd.resolve("llama-3.1-8b", census="off")
    foreach = nd.Strategy.parse("fsdp=4,seq=128,param_dtype=fp32,compute_dtype=bf16,optimizer=adamw_foreach")
    assert "optimizer=adamw" in {s.differences(foreach) for s in _one_change(foreach)}
    fused = model.evaluate(attrs.evolve(foreach, optimizer="adamw"))
    usable = (fused.peak_bytes + model.evaluate(foreach).peak_bytes) // 2
    hardware = attrs.evolve(model.hardware, memory_bytes=usable + model.hardware.cuda_context_bytes)
    offered = [change for change, _ in one_change_fits(model, foreach, top=50, hardware=hardware)]
    assert "optimizer=adamw" in offered
