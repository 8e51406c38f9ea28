"""Weight conversion from Hugging Face ``transformers`` models (imported only when used).

Each converter reads the HF configuration into a :class:`~companion.config.ModelConfig`, refuses
settings the book's models do not implement, builds the model and copies every tensor, checking
shapes as it goes. Mistral is Llama with a sliding window (``config.sliding_window``), so it
shares Llama's converter and names. Parameter names on the two sides:

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

__all__ = ["gpt_from_hf", "bert_from_hf", "bert_from_state_dict", "t5_from_hf"]

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


def _rope(c) -> tuple[float, dict | None]:
    # RoPE's base and scaling: transformers 5 keeps both in rope_parameters, 4 in rope_theta and rope_scaling
    rope = getattr(c, "rope_parameters", None) or {**(getattr(c, "rope_scaling", None) or {}),
                                                   "rope_theta": getattr(c, "rope_theta", 10000.0)}
    kind = rope.get("rope_type", rope.get("type", "default"))
    _refuse(kind not in ("default", "linear", "dynamic"), f"RoPE scaling {kind!r}")
    _refuse(rope.get("partial_rotary_factor", 1.0) != 1.0, "partial_rotary_factor != 1")
    scaling = None if kind == "default" else {"rope_type": kind, "factor": float(rope["factor"])}
    return float(rope["rope_theta"]), scaling


def _llama_config(c) -> ModelConfig:
    base, scaling = _rope(c)
    bias, mlp_bias = bool(getattr(c, "attention_bias", False)), bool(getattr(c, "mlp_bias", False))
    _refuse(c.hidden_act != "silu", f"hidden_act={c.hidden_act!r}")
    _refuse(bias != mlp_bias, "attention_bias and mlp_bias differ")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return ModelConfig(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                       n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads, head_dim=head_dim,
                       d_ff=c.intermediate_size, max_len=c.max_position_embeddings, position="rope",
                       rope_base=base, rope_scaling=scaling, sliding_window=getattr(c, "sliding_window", None),
                       norm="rmsnorm", norm_eps=c.rms_norm_eps, norm_position="pre", ffn="swiglu", bias=bias,
                       tie_embeddings=bool(c.tie_word_embeddings), dropout=0.0, residual_init_scale=False)


def gpt_from_hf(cls, hf_model: nn.Module):
    """Build ``cls`` (:class:`~companion.models.gpt.GPT`) from a GPT-2, Llama or Mistral causal LM (see above)."""
    kind = type(hf_model).__name__
    if kind not in ("GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM"):
        raise TypeError(f"hf_model must be a transformers GPT2LMHeadModel, LlamaForCausalLM or MistralForCausalLM, "
                        f"got {kind}")
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


def _bert_config(c) -> ModelConfig:
    _refuse(c.hidden_act not in _GPT2_ACTIVATIONS, f"hidden_act={c.hidden_act!r}")
    positions = getattr(c, "position_embedding_type", "absolute")
    _refuse(positions != "absolute", f"position_embedding_type={positions!r}")
    return ModelConfig(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                       n_heads=c.num_attention_heads, d_ff=c.intermediate_size, max_len=c.max_position_embeddings,
                       position="learned", norm="layernorm", norm_eps=c.layer_norm_eps, norm_position="post",
                       ffn=_GPT2_ACTIVATIONS[c.hidden_act], bias=True, tie_embeddings=True, dropout=0.0,
                       embedding_norm=True, type_vocab_size=c.type_vocab_size, residual_init_scale=False,
                       ffn_dropout=0.0, pad_id=c.pad_token_id if c.pad_token_id is not None else 0)


def bert_from_hf(cls, hf_model: nn.Module):
    """Build ``cls`` (:class:`~companion.models.bert.BERT`) from a ``BertModel`` or ``BertForPreTraining``."""
    kind = type(hf_model).__name__
    if kind not in ("BertModel", "BertForPreTraining"):
        raise TypeError(f"hf_model must be a transformers BertModel or BertForPreTraining, got {kind}")
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    param = next(hf_model.parameters())
    return bert_from_state_dict(cls, hf_model.config, sd, device=param.device, dtype=param.dtype)


def bert_from_state_dict(cls, hf_config, sd: dict[str, Tensor], device=None, dtype=None):
    """Build ``cls`` (:class:`~companion.models.bert.BERT`) from a BERT state dict in ``transformers``' names.

    ``hf_config`` is a ``BertConfig`` or anything with its attributes (``config.json`` read into a
    ``types.SimpleNamespace``), so a checkpoint loads without ``transformers``. Keys may carry
    ``BertForPreTraining``'s ``"bert."`` prefix; its heads (``cls.*``) are copied when present.
    """
    config = _bert_config(hf_config)
    p0 = "bert." if "bert.embeddings.word_embeddings.weight" in sd else ""
    heads = any(k.startswith("cls.") for k in sd)
    if heads:
        _check_tied_decoder(sd, p0 + "embeddings.word_embeddings.weight")
    if p0 + "pooler.dense.weight" not in sd:
        raise ValueError("cannot convert this model: it has no pooler (add_pooling_layer=False)")
    model = cls(config).to(device=device, dtype=dtype)
    e = p0 + "embeddings."
    _copy(model.tok_emb.weight, sd[e + "word_embeddings.weight"], "word_embeddings")
    _copy(model.stack.positions.table.weight, sd[e + "position_embeddings.weight"], "position_embeddings")
    _copy(model.seg_emb.weight, sd[e + "token_type_embeddings.weight"], "token_type_embeddings")
    _copy(model.stack.embedding_norm.weight, sd[e + "LayerNorm.weight"], "embeddings.LayerNorm")
    _copy(model.stack.embedding_norm.bias, sd[e + "LayerNorm.bias"], "embeddings.LayerNorm")
    for i, block in enumerate(model.layers):
        p = f"{p0}encoder.layer.{i}."
        for part in ("weight", "bias"):
            qkv = torch.cat([sd[p + f"attention.self.{n}.{part}"] for n in ("query", "key", "value")])
            _copy(getattr(block.self_attn.in_proj, part), qkv, p + "attention.self")
            for ours, theirs in ((block.self_attn.out_proj, "attention.output.dense"),
                                 (block.self_norm, "attention.output.LayerNorm"),
                                 (block.ffn.w1, "intermediate.dense"), (block.ffn.w2, "output.dense"),
                                 (block.ffn_norm, "output.LayerNorm")):
                _copy(getattr(ours, part), sd[p + f"{theirs}.{part}"], p + theirs)
    for part in ("weight", "bias"):
        _copy(getattr(model.pooler, part), sd[p0 + f"pooler.dense.{part}"], "pooler")
        if heads:
            _copy(getattr(model.mlm_transform, part), sd[f"cls.predictions.transform.dense.{part}"], "transform")
            _copy(getattr(model.mlm_norm, part), sd[f"cls.predictions.transform.LayerNorm.{part}"], "transform.LN")
            _copy(getattr(model.nsp_head, part), sd[f"cls.seq_relationship.{part}"], "seq_relationship")
    if heads:
        _copy(model.mlm_bias, sd["cls.predictions.bias"], "cls.predictions.bias")
    return model.eval()


def _check_tied_decoder(sd: dict[str, Tensor], word_embeddings: str) -> None:
    """Refuse an MLM decoder that is not the word embeddings (companion's BERT ties them, as Devlin et al. do)."""
    for key, tied_to in (("cls.predictions.decoder.weight", word_embeddings),
                         ("cls.predictions.decoder.bias", "cls.predictions.bias")):
        if key in sd and tied_to in sd and not torch.equal(sd[key], sd[tied_to]):
            same_shape = sd[key].shape == sd[tied_to].shape
            gap = (f"max |difference| {(sd[key].float() - sd[tied_to].float()).abs().max().item():.3g}" if same_shape
                   else f"shapes {tuple(sd[key].shape)} and {tuple(sd[tied_to].shape)}")
            raise ValueError(f"cannot convert this model: its MLM decoder {key} is not tied to {tied_to} "
                             f"({gap}); companion's BERT ties them, as BERT does (tie_word_embeddings=True)")


def _t5_config(c) -> ModelConfig:
    # T5 ties the output layer to the embeddings *and* rescales the decoder's states by d^-0.5;
    # T5 v1.1 does neither. transformers 5 records the rescaling as scale_decoder_outputs; a model
    # that does not rescale is converted with its own output layer (a copy when the two are tied).
    scaled = bool(getattr(c, "scale_decoder_outputs", c.tie_word_embeddings))
    ffns = {"relu": "relu", "gated-gelu": "geglu"}
    _refuse(c.feed_forward_proj not in ffns, f"feed_forward_proj={c.feed_forward_proj!r}")
    return ModelConfig(vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.num_layers,
                       n_decoder_layers=c.num_decoder_layers, n_heads=c.num_heads, head_dim=c.d_kv, d_ff=c.d_ff,
                       max_len=512, position="t5", t5_num_buckets=c.relative_attention_num_buckets,
                       t5_max_distance=c.relative_attention_max_distance, norm="rmsnorm",
                       norm_eps=c.layer_norm_epsilon, norm_position="pre", ffn=ffns[c.feed_forward_proj], bias=False,
                       tie_embeddings=scaled, attention_scale=1.0, dropout=0.0, init_std=None, pad_id=c.pad_token_id)


def _copy_t5_attention(attention: nn.Module, sd: dict, p: str) -> None:
    _copy(attention.in_proj.weight, torch.cat([sd[p + n + ".weight"] for n in "qkv"]), p + "qkv")
    _copy(attention.out_proj.weight, sd[p + "o.weight"], p + "o")


def _copy_t5_ffn(ffn: nn.Module, sd: dict, p: str, gated: bool) -> None:
    if gated:
        for ours, theirs in (("w_gate", "wi_0"), ("w_in", "wi_1"), ("w_out", "wo")):
            _copy(getattr(ffn, ours).weight, sd[p + f"DenseReluDense.{theirs}.weight"], p + theirs)
    else:
        _copy(ffn.w1.weight, sd[p + "DenseReluDense.wi.weight"], p + "wi")
        _copy(ffn.w2.weight, sd[p + "DenseReluDense.wo.weight"], p + "wo")


def t5_from_hf(cls, hf_model: nn.Module):
    """Build ``cls`` (:class:`~companion.models.t5.T5`) from a ``T5ForConditionalGeneration``."""
    kind = type(hf_model).__name__
    if kind != "T5ForConditionalGeneration":
        raise TypeError(f"hf_model must be a transformers T5ForConditionalGeneration, got {kind}")
    config = _t5_config(hf_model.config)
    gated = config.ffn == "geglu"
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    param = next(hf_model.parameters())
    model = cls(config).to(device=param.device, dtype=param.dtype)
    _copy(model.src_embed.weight, sd["shared.weight"], "shared")
    for stack, name in ((model.encoder, "encoder"), (model.decoder, "decoder")):
        bias = f"{name}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        _copy(stack.positions.t5.relative_attention_bias.weight, sd[bias], bias)
        for i, block in enumerate(stack.layers):
            p = f"{name}.block.{i}.layer."
            _copy_t5_attention(block.self_attn, sd, p + "0.SelfAttention.")
            _copy(block.self_norm.weight, sd[p + "0.layer_norm.weight"], p + "0.layer_norm")
            ffn_layer = 1
            if name == "decoder":
                _copy_t5_attention(block.cross_attn, sd, p + "1.EncDecAttention.")
                _copy(block.cross_norm.weight, sd[p + "1.layer_norm.weight"], p + "1.layer_norm")
                ffn_layer = 2
            _copy_t5_ffn(block.ffn, sd, p + f"{ffn_layer}.", gated)
            _copy(block.ffn_norm.weight, sd[p + f"{ffn_layer}.layer_norm.weight"], p + f"{ffn_layer}.layer_norm")
        _copy(stack.norm.weight, sd[f"{name}.final_layer_norm.weight"], f"{name}.final_layer_norm")
    if not config.tie_embeddings:
        _copy(model.out_proj.weight, sd.get("lm_head.weight", sd["shared.weight"]), "lm_head")
    return model.eval()
