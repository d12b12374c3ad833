"""Tiny random GatedDeltaNet targets (float32), built through mlx-lm's own Model classes."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import qwen3_5, qwen3_next


def tiny_qwen35_config(num_layers: int = 4, full_attention_interval: int = 2, **overrides) -> dict:
    config = {
        "model_type": "qwen3_5",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": 256,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": full_attention_interval,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    }
    config.update(overrides)
    return config


def make_tiny_qwen35(
    seed: int = 0, num_layers: int = 4, full_attention_interval: int = 2, **overrides
) -> nn.Module:
    """Random float32 qwen3_5, loaded as mlx-lm loads a qwen3_5 checkpoint."""
    mx.random.seed(seed)
    config = tiny_qwen35_config(num_layers, full_attention_interval, **overrides)
    model = qwen3_5.Model(qwen3_5.ModelArgs(model_type="qwen3_5", text_config=config))
    return _finish(model, config["hidden_size"])


def make_tiny_qwen3_next(seed: int = 0, num_layers: int = 4) -> nn.Module:
    """Random float32 qwen3_next (fused qkvz/ba projections, MoE MLPs)."""
    mx.random.seed(seed)
    config = tiny_qwen35_config(num_layers, 2, model_type="qwen3_next")
    config.pop("rope_parameters")
    config.update(
        rope_theta=10000.0,
        partial_rotary_factor=0.25,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=32,
        mlp_only_layers=[],
        moe_intermediate_size=32,
    )
    model = qwen3_next.Model(qwen3_next.ModelArgs.from_dict(config))
    return _finish(model, config["hidden_size"])


def _finish(model: nn.Module, hidden: int) -> nn.Module:
    """Make linear layers neither forget at once nor never; perturb norms off identity."""
    for layer in model.layers:
        if layer.is_linear:
            attn = layer.linear_attn
            hv = attn.num_v_heads
            # g = exp(-A * softplus(a + dt_bias)) lands mostly in ~[0.5, 0.98]
            attn.A_log = mx.log(mx.random.uniform(0.05, 1.0, (hv,)))
            attn.dt_bias = mx.random.uniform(-1.0, 0.0, (hv,))
            attn.norm.weight = 1.0 + 0.1 * mx.random.normal(attn.norm.weight.shape)
        layer.input_layernorm.weight = 1.0 + 0.1 * mx.random.normal((hidden,))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model
