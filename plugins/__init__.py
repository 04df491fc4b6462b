"""ndcost's built-in plugins: each module is its own entry point of the ``ndcost.plugins`` group."""
from __future__ import annotations

# Every module declared under [project.entry-points."ndcost.plugins"] in pyproject.toml (a test holds them
# equal): the plugin manager refuses an install whose metadata lacks one as stale.
BUILTIN_ENTRY_POINTS = frozenset({
    "accounting", "calibration", "census_stack", "checkpoint_policies", "collectives", "contracts_cuda_sdpa",
    "contracts_deepseek_v4", "contracts_delta_rule", "contracts_gpt_oss", "contracts_npu",
    "contracts_transformer_engine", "estimators_activations", "estimators_flops", "family_deepseek_v2",
    "family_deepseek_v3", "family_deepseek_v32", "family_deepseek_v4", "family_generic", "family_glm4_moe",
    "family_gpt2", "family_gpt_oss", "family_llama", "family_mixtral", "family_qwen2", "family_qwen3",
    "family_qwen3_5", "family_qwen3_5_moe", "family_qwen3_moe", "family_qwen3_next", "formulas_attention",
    "formulas_common", "formulas_deepseek_v4", "formulas_gpt_oss", "formulas_linear_attention", "formulas_moe",
    "hardware", "op_records", "optimizers", "runtimes", "schedules", "storage", "trainer_deepspeed",
    "trainer_hyperparallel", "trainer_megatron", "trainer_torchtitan",
})
