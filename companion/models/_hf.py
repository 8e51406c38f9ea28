"""Weight conversion from Hugging Face ``transformers`` models (imported only when used).

Each converter reads the HF configuration into a :class:`~companion.config.ModelConfig`, refuses
settings the book's models do not implement, builds the model and copies every tensor, checking
shapes as it goes. Parameter names on the two sides:

============================  ==============================================  ===================
ours (GPT block ``i``)        GPT-2 (``transformer.h.i``)                     Llama (``model.layers.i``)
============================  ==============================================  ===================
``self_attn.in_proj``         ``attn.c_attn`` (Conv1D: weight transposed)     ``q_proj``, ``k_proj``, ``v_proj`` stacked
``self_attn.out_proj``        ``attn.c_proj``                                 ``o_proj``
``self_norm``                 ``ln_1``                                        ``input_layernorm``
``ffn_norm``                  ``ln_2``                                        ``post_attention_layernorm``
``ffn.w1`` / ``ffn.w2``       ``mlp.c_fc`` / ``mlp.c_proj``                   —
``ffn.w_gate/w_in/w_out``     —                                               ``gate_proj/up_proj/down_proj``
============================  ==============================================  ===================
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from companion.config import ModelConfig

__all__ = ["gpt_from_hf"]

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def _copy(target: Tensor, source: Tensor, name: str) -> None:
    if target.shape != source.shape:
        raise ValueError(f"{name}: shape {tuple(source.shape)} does not fit {tuple(target.shape)}")
    with torch.no_grad():
        target.copy_(source)


def _refuse(condition: bool, message: str) -> None:
    if condition:
        raise ValueError(f"cannot convert this model: {message}")


def _gpt2_config(c) -> ModelConfig:
    _refuse(c.activation_function not in _GPT2_ACTIVATIONS, f"activation_function={c.activation_function!r}")
    _refuse(c.scale_attn_by_inverse_layer_idx, "scale_attn_by_inverse_layer_idx=True")
    _refuse(not c.scale_attn_weights, "scale_attn_weights=False")
    return ModelConfig(vocab_size=c.vocab_size, d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head,
                       d_ff=c.n_inner, max_len=c.n_positions, position="learned", norm="layernorm",
                       norm_eps=c.layer_norm_epsilon, norm_position="pre", ffn=_GPT2_ACTIVATIONS[c.activation_function],
                       bias=True, tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)), dropout=0.0)


def _llama_config(c) -> ModelConfig:
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": getattr(c, "rope_theta", 10000.0)}
    _refuse(rope.get("rope_type", "default") != "default", f"RoPE scaling {rope.get('rope_type')!r}")
    _refuse(c.hidden_act != "silu", f"hidden_act={c.hidden_act!r}")
    _refuse(c.attention_bias != c.mlp_bias, "attention_bias and mlp_bias differ")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return ModelConfig(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                       n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads, head_dim=head_dim,
                       d_ff=c.intermediate_size, max_len=c.max_position_embeddings, position="rope",
                       rope_base=float(rope["rope_theta"]), norm="rmsnorm", norm_eps=c.rms_norm_eps,
                       norm_position="pre", ffn="swiglu", bias=bool(c.attention_bias),
                       tie_embeddings=bool(c.tie_word_embeddings), dropout=0.0)


def gpt_from_hf(cls, hf_model: nn.Module):
    """Build ``cls`` (:class:`~companion.models.gpt.GPT`) from a GPT-2 or Llama causal LM (see the table above)."""
    kind = type(hf_model).__name__
    if kind not in ("GPT2LMHeadModel", "LlamaForCausalLM"):
        raise TypeError(f"hf_model must be a transformers GPT2LMHeadModel or LlamaForCausalLM, got {kind}")
    config = _gpt2_config(hf_model.config) if kind == "GPT2LMHeadModel" else _llama_config(hf_model.config)
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    model = cls(config).to(device=next(hf_model.parameters()).device, dtype=next(hf_model.parameters()).dtype)
    if kind == "GPT2LMHeadModel":
        _copy(model.tok_emb.weight, sd["transformer.wte.weight"], "wte")
        _copy(model.stack.positions.table.weight, sd["transformer.wpe.weight"], "wpe")
        for i, block in enumerate(model.layers):
            p = f"transformer.h.{i}."
            _copy(block.self_attn.in_proj.weight, sd[p + "attn.c_attn.weight"].T, p + "attn.c_attn.weight")
            _copy(block.self_attn.in_proj.bias, sd[p + "attn.c_attn.bias"], p + "attn.c_attn.bias")
            _copy(block.self_attn.out_proj.weight, sd[p + "attn.c_proj.weight"].T, p + "attn.c_proj.weight")
            _copy(block.self_attn.out_proj.bias, sd[p + "attn.c_proj.bias"], p + "attn.c_proj.bias")
            _copy(block.ffn.w1.weight, sd[p + "mlp.c_fc.weight"].T, p + "mlp.c_fc.weight")
            _copy(block.ffn.w1.bias, sd[p + "mlp.c_fc.bias"], p + "mlp.c_fc.bias")
            _copy(block.ffn.w2.weight, sd[p + "mlp.c_proj.weight"].T, p + "mlp.c_proj.weight")
            _copy(block.ffn.w2.bias, sd[p + "mlp.c_proj.bias"], p + "mlp.c_proj.bias")
            for ours, theirs in ((block.self_norm, "ln_1"), (block.ffn_norm, "ln_2")):
                _copy(ours.weight, sd[p + theirs + ".weight"], p + theirs)
                _copy(ours.bias, sd[p + theirs + ".bias"], p + theirs)
        _copy(model.stack.norm.weight, sd["transformer.ln_f.weight"], "ln_f")
        _copy(model.stack.norm.bias, sd["transformer.ln_f.bias"], "ln_f")
        if not config.tie_embeddings:
            _copy(model.head.weight, sd["lm_head.weight"], "lm_head")
    else:
        _copy(model.tok_emb.weight, sd["model.embed_tokens.weight"], "embed_tokens")
        for i, block in enumerate(model.layers):
            p = f"model.layers.{i}."
            qkv = [sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]
            _copy(block.self_attn.in_proj.weight, torch.cat(qkv), p + "self_attn.qkv")
            _copy(block.self_attn.out_proj.weight, sd[p + "self_attn.o_proj.weight"], p + "o_proj")
            if config.bias:
                _copy(block.self_attn.in_proj.bias, torch.cat([sd[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]),
                      p + "self_attn.qkv.bias")
                _copy(block.self_attn.out_proj.bias, sd[p + "self_attn.o_proj.bias"], p + "o_proj.bias")
            for ours, theirs in (("w_gate", "gate_proj"), ("w_in", "up_proj"), ("w_out", "down_proj")):
                _copy(getattr(block.ffn, ours).weight, sd[p + f"mlp.{theirs}.weight"], p + theirs)
                if config.bias:
                    _copy(getattr(block.ffn, ours).bias, sd[p + f"mlp.{theirs}.bias"], p + theirs + ".bias")
            _copy(block.self_norm.weight, sd[p + "input_layernorm.weight"], p + "input_layernorm")
            _copy(block.ffn_norm.weight, sd[p + "post_attention_layernorm.weight"], p + "post_attention_layernorm")
        _copy(model.stack.norm.weight, sd["model.norm.weight"], "norm")
        if not config.tie_embeddings:
            _copy(model.head.weight, sd["lm_head.weight"], "lm_head")
    return model.eval()
