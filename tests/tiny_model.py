"""The tiny hybrid model the CPU tests of the GPU harness build: every field a real config has, at sizes
the interpreter runs in seconds."""

TINY = {
    "name": "tiny-hybrid", "hidden_size": 64, "layer_pattern": ["gdn", "gdn", "gdn", "attn"], "num_layers": 4,
    "gdn": {"num_k_heads": 2, "num_v_heads": 4, "head_k_dim": 16, "head_v_dim": 16, "conv_kernel": 4},
    "attention": {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16},
    "moe": {"num_experts": 8, "top_k": 2, "shared_experts": 1, "expert_width": 32},
    "vocab_size": 128, "total_params": 1.0e6, "active_params": 2.0e5, "mtp_depth": 2,
}
# The same hybrid with a dense MLP in place of the MoE (Qwen3.5's dense sizes).
TINY_DENSE = {**{k: v for k, v in TINY.items() if k != "moe"}, "name": "tiny-dense-hybrid",
              "mlp": {"intermediate_size": 48}, "active_params": 1.0e6}
# A block-FP8 checkpoint of a tiny hybrid: every quantised projection whole 128 x 128 blocks.
TINY_FP8 = {
    "name": "tiny-fp8-hybrid", "hidden_size": 128, "layer_pattern": ["gdn", "gdn", "gdn", "attn"], "num_layers": 4,
    "gdn": {"num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 128, "head_v_dim": 128, "conv_kernel": 4},
    "attention": {"num_q_heads": 1, "num_kv_heads": 1, "head_dim": 128},
    "moe": {"num_experts": 4, "top_k": 2, "shared_experts": 1, "expert_width": 128},
    "vocab_size": 128, "total_params": 4.0e6, "active_params": 1.0e6, "mtp_depth": 2, "weights": "fp8",
}
