"""mlx-lm: the models kvaudit's mlx-lm worker (mlx_worker.py) runs its caches under.

- kvaudit's tiny GGUF llama (`gguf_model`): the very file its llama.cpp targets load (the hello's
  option `models`), read with mx.load and renamed to mlx-lm's llama names: dims, rms eps, RoPE
  base and vocabulary from the file's metadata; llama.cpp's llama rotates adjacent pairs,
  mlx's rope_traditional=True; tied embeddings when the file has no output.weight.
- A tiny llama built in code (hidden 64, 2 layers, 4 heads, 2 KV heads, intermediate 128,
  vocabulary 97, random weights from mx.random.seed(0), float32), with sliding-window layers for
  gemma2: where the hello gave no file (a worker started alone, arch gemma2).
- mlx-lm's own llama4 text model (`llama4_model`), built tiny in code the same way.

Standard library, mlx and mlx_lm only; the worker imports it from its own folder.
"""

import dataclasses

import mlx.core as mx
import mlx_lm
from mlx_lm.models import llama

VOCAB = 97  # the vocabulary of the models built in code

MODEL_KINDS = ("llama", "llama4")
# llama4's text model as the worker builds it (mlx_lm/models/llama4.py): 4 layers, so layers
# 0-2 attend by chunks (ChunkedKVCache, `maybe_trim_front` before each forward) and layer 3 is
# the global one (KVCache, no RoPE); one expert per MoE layer is never used: interleave step 5
LLAMA4_LAYERS = 4
LLAMA4_TEXT = dict(attention_bias=False, head_dim=16, hidden_size=64, interleave_moe_layer_step=5,
                   intermediate_size=128, intermediate_size_mlp=128, max_position_embeddings=4096,
                   model_type="llama4_text", num_attention_heads=4, num_experts_per_tok=1,
                   num_hidden_layers=LLAMA4_LAYERS, num_key_value_heads=2, num_local_experts=1,
                   rms_norm_eps=1e-5, rope_scaling=None, rope_theta=10000.0, use_qk_norm=False,
                   vocab_size=VOCAB)



MODELS = {}       # a model_key -> the model built for it, kept for the worker's life
MODEL_FILES = {}  # architecture -> GGUF path (the hello's option `models`)
ROPE = {"traditional": True}  # llama.cpp's llama rotates adjacent pairs; fault rope_halves: False

# kvaudit's GGUF tensor names (src/model/tiny/mod.rs) -> mlx-lm's llama names
GGUF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
GGUF_BLOCK_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
                    "ffn_norm": "post_attention_layernorm"}


def mlx_name(gguf_name):
    """mlx-lm's llama name of a GGUF tensor (`blk.0.attn_q.weight` -> 
    `model.layers.0.self_attn.q_proj.weight`)."""
    parts = gguf_name.split(".")
    if len(parts) == 2 and parts[0] in GGUF_NAMES:
        return GGUF_NAMES[parts[0]] + "." + parts[1]
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in GGUF_BLOCK_NAMES:
        return "model.layers.%s.%s.%s" % (parts[1], GGUF_BLOCK_NAMES[parts[2]], parts[3])
    raise ValueError("GGUF tensor %r has no mlx-lm llama name" % gguf_name)


def gguf_model(path):
    """mlx-lm's llama with the weights and hyper-parameters of kvaudit's GGUF file `path`
    (GGUF stores a matrix as [in, out] with the first dimension fastest, which mx.load gives as
    [out, in]: nn.Linear's layout, so no transpose)."""
    arrays, meta = mx.load(path, return_metadata=True)
    if meta.get("general.architecture") != "llama":
        raise ValueError("%s: architecture %r, not llama" % (path, meta.get("general.architecture")))

    def num(key):
        return meta["llama." + key].item()

    args = llama.ModelArgs(
        model_type="llama", hidden_size=int(num("embedding_length")),
        num_hidden_layers=int(num("block_count")),
        intermediate_size=int(num("feed_forward_length")),
        num_attention_heads=int(num("attention.head_count")),
        num_key_value_heads=int(num("attention.head_count_kv")),
        rms_norm_eps=float(num("attention.layer_norm_rms_epsilon")),
        vocab_size=int(num("vocab_size")), rope_theta=float(num("rope.freq_base")),
        rope_traditional=ROPE["traditional"], max_position_embeddings=int(num("context_length")),
        tie_word_embeddings="output.weight" not in arrays)
    m = llama.Model(args)
    m.load_weights([(mlx_name(k), v) for k, v in arrays.items()], strict=True)
    mx.eval(m.parameters())
    return m


def llama4_model(chunk_size):
    """mlx-lm's llama4 (text) model, tiny, random weights from mx.random.seed(0), float32; the
    arguments this mlx-lm's TextArgs knows (the same in 0.28.4-0.32.2)."""
    from mlx_lm.models import llama4  # imported where used: the llama setups never need it
    known = {f.name for f in dataclasses.fields(llama4.TextArgs)}
    text = {k: v for k, v in dict(LLAMA4_TEXT, attention_chunk_size=chunk_size).items()
            if k in known}
    mx.random.seed(0)
    m = llama4.Model(llama4.ModelArgs(model_type="llama4", text_config=text))
    mx.eval(m.parameters())
    if len(m.layers) != LLAMA4_LAYERS or not hasattr(m, "make_cache"):
        raise RuntimeError("mlx-lm %s: llama4 is not %d layers with make_cache"
                           % (getattr(mlx_lm, "__version__", "?"), LLAMA4_LAYERS))
    return m


def model_for(cfg):
    """The model of a setup (`Config.model_key`): built once, kept for the worker's life."""
    m = MODELS.get(cfg.model_key)
    if m is None and cfg.model_key[0] == "gguf":
        m = MODELS[cfg.model_key] = gguf_model(cfg.model_key[1])
    if m is None and cfg.model_key[0] == "llama4":
        m = MODELS[cfg.model_key] = llama4_model(cfg.model_key[1])
    if m is None:
        head_dim, window = cfg.model_key
        kw = {}
        if window:
            kw.update(layer_types=["sliding_attention", "full_attention"], sliding_window=window)
        if head_dim:
            kw["head_dim"] = head_dim
        args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2,
                               intermediate_size=128, num_attention_heads=4,
                               num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB, **kw)
        mx.random.seed(0)
        m = llama.Model(args)
        mx.eval(m.parameters())
        MODELS[cfg.model_key] = m
    return m
