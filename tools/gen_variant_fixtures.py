#!/usr/bin/env python3
"""Makes the hybrid fixtures that cover what ../shared/fixtures' tiny models leave out
(tests/data/models/<name>), with the shared generator (gen_fixtures.py: transformers on the
CPU in float32, the same randomisation, reference files and seeds), where torch and
transformers are installed:

    python3 tools/gen_variant_fixtures.py PATH/TO/gen_fixtures.py OUT [NAME ...]

  falcon_h1_nbg     Falcon-H1 with every muP multiplier away from 1 and the gated RMSNorm
                    on, before the gate (mamba_norm_before_gate), over two groups
  granite_dense     Granite 4.0-H without experts (shared MLP only), no positional encoding,
                    two groups
  nemotron_h_moe    Nemotron-H with MoE layers (sigmoid routing with a score correction bias,
                    a shared expert, routed_scaling_factor, renormalised top-k)
  qwen3_5_moe       Qwen3.5 with experts and a shared expert (model_type qwen3_5_moe_text)
"""
import sys

GEN, OUT = sys.argv[1], sys.argv[2]
ONLY = sys.argv[3:]

EXTRA = '''
    "falcon_h1_nbg": ("falcon_h1", common(num_hidden_layers=4, vocab_size=256, intermediate_size=64, mamba_d_ssm=64, mamba_n_heads=4,
                      mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
                      mamba_expand=1, mamba_chunk_size=16, projectors_bias=False, mamba_use_mlp=True,
                      mamba_rms_norm=True, mamba_norm_before_gate=True,
                      embedding_multiplier=0.9, lm_head_multiplier=1.5, attention_in_multiplier=1.2,
                      attention_out_multiplier=0.8, key_multiplier=1.3, ssm_in_multiplier=0.7,
                      ssm_out_multiplier=1.2, ssm_multipliers=[0.9, 1.1, 0.8, 1.2, 0.7],
                      mlp_multipliers=[0.8, 1.2])),
    "granite_dense": ("granitemoehybrid", common(num_hidden_layers=4, vocab_size=256,
                      layer_types=["mamba", "mamba", "attention", "mamba"],
                      mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2,
                      mamba_expand=1, mamba_d_conv=4, mamba_chunk_size=16, num_local_experts=0,
                      num_experts_per_tok=0, shared_intermediate_size=64,
                      embedding_multiplier=3.0, logits_scaling=1.5, residual_multiplier=0.7,
                      attention_multiplier=0.05, position_embedding_type="nope")),
    "nemotron_h_moe": ("nemotron_h", common(num_hidden_layers=4, vocab_size=256,
                       hybrid_override_pattern="ME*E",
                       mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
                       conv_kernel=4, chunk_size=16, expand=1, n_routed_experts=8,
                       num_experts_per_tok=2, moe_intermediate_size=32,
                       moe_shared_expert_intermediate_size=24, n_group=1, topk_group=1,
                       routed_scaling_factor=2.5, norm_topk_prob=True)),
    "qwen3_5_moe": ("qwen3_5_moe_text", common(num_hidden_layers=4, vocab_size=256,
                    layer_types=["linear_attention", "full_attention", "linear_attention",
                                 "full_attention"],
                    linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=32,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4, partial_rotary_factor=0.25,
                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=24, tie_word_embeddings=False)),
'''

src = open(GEN).read()
src = src.replace("ARCHS = {", "ARCHS = {" + EXTRA, 1)
sys.argv = [GEN, OUT, "1"] + (ONLY or ["falcon_h1_nbg", "granite_dense", "nemotron_h_moe",
                                       "qwen3_5_moe"])
exec(compile(src, GEN, "exec"), {"__name__": "__main__"})
