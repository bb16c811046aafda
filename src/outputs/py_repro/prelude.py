import copy
import dataclasses
import os
import sys
import tempfile
import traceback

import mlx.core as mx
import mlx_lm
from mlx_lm.models import cache as C
from mlx_lm.models import llama


def not_replayed(etype, value, tb):
    """An exception outside the checked op: the trace did not replay as kvaudit ran it."""
    traceback.print_exception(etype, value, tb)
    print("could not replay the trace: %s outside the checked op" % etype.__name__)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(2)


sys.excepthook = not_replayed


def unsupported(why):
    """kvaudit's mapping has no mlx-lm call for this op here (the trial would have stopped)."""
    print("could not replay the trace: " + why)
    sys.exit(2)


print("mlx-lm %s, mlx %s" % (getattr(mlx_lm, "__version__", "?"), getattr(mx, "__version__", "?")))

# <= 0.31: `state` + `meta_state`; 0.32: the scalars are folded into `state`
META_STATE = hasattr(C._BaseCache, "meta_state")
SIZE = hasattr(C.KVCache, "size")  # 0.28: __len__ instead


M64 = (1 << 64) - 1


def splitmix64(state):
    """One step of splitmix64: (the next state, its output), as kvaudit's model/tiny has it."""
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def gguf_tensor(name, rows_out, rows_in, fan_in):
    """A weight of kvaudit's tiny GGUF llama, bit for bit: uniform in [-a, a), a = sqrt(3 /
    fan_in), from a splitmix64 stream seeded by the model's seed and the FNV-1a of the name;
    GGUF's [in, out] with the first dimension fastest is mlx's [out, in]."""
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    _, state = splitmix64(GGUF["seed"] ^ h)
    bits = []
    for _ in range(rows_out * rows_in):
        state, z = splitmix64(state)
        bits.append(z >> 40)
    unit = mx.array(bits, dtype=mx.float32) * (2.0 / 16777216.0) - 1.0
    a = mx.sqrt(mx.array(3.0, dtype=mx.float32) / mx.array(float(fan_in), dtype=mx.float32))
    return (unit * a).reshape(rows_out, rows_in)


def gguf_llama():
    """The model kvaudit's mlx-lm worker runs (`gguf_model`): mlx-lm's llama with the weights of
    kvaudit's tiny GGUF llama (the file its llama.cpp targets load), RoPE on adjacent pairs
    (rope_traditional=True, llama.cpp's llama layout), no download and no file."""
    g = GGUF
    embd, hd = g["n_embd"], g["n_embd"] // g["n_head"]
    q, kv, ff, vocab = g["n_head"] * hd, g["n_head_kv"] * hd, g["n_ff"], g["n_vocab"]
    args = llama.ModelArgs(
        model_type="llama", hidden_size=embd, num_hidden_layers=g["n_layer"],
        intermediate_size=ff, num_attention_heads=g["n_head"], num_key_value_heads=g["n_head_kv"],
        rms_norm_eps=g["rms_eps"], vocab_size=vocab, rope_theta=g["rope_freq_base"],
        rope_traditional=True, max_position_embeddings=g["n_ctx_train"],
        tie_word_embeddings=False)
    w = [("model.embed_tokens.weight", gguf_tensor("token_embd.weight", vocab, embd, 1)),
         ("model.norm.weight", mx.ones((embd,))),
         ("lm_head.weight", gguf_tensor("output.weight", vocab, embd, embd))]
    for l in range(g["n_layer"]):
        for gname, mname, rows_in, rows_out in (
                ("attn_q", "self_attn.q_proj", embd, q), ("attn_k", "self_attn.k_proj", embd, kv),
                ("attn_v", "self_attn.v_proj", embd, kv), ("attn_output", "self_attn.o_proj", q, embd),
                ("ffn_gate", "mlp.gate_proj", embd, ff), ("ffn_up", "mlp.up_proj", embd, ff),
                ("ffn_down", "mlp.down_proj", ff, embd)):
            w.append(("model.layers.%d.%s.weight" % (l, mname),
                      gguf_tensor("blk.%d.%s.weight" % (l, gname), rows_out, rows_in, rows_in)))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            w.append(("model.layers.%d.%s.weight" % (l, norm), mx.ones((embd,))))
    m = llama.Model(args)
    m.load_weights(w, strict=True)
    mx.eval(m.parameters())
    return m


# mlx-lm's llama4 text model as kvaudit's worker builds it (`LLAMA4_TEXT`): 4 layers, layer 3
# global; no MoE layer (interleave step 5)
LLAMA4_TEXT = dict(attention_bias=False, head_dim=16, hidden_size=64, interleave_moe_layer_step=5,
                   intermediate_size=128, intermediate_size_mlp=128, max_position_embeddings=4096,
                   model_type="llama4_text", num_attention_heads=4, num_experts_per_tok=1,
                   num_hidden_layers=4, num_key_value_heads=2, num_local_experts=1,
                   rms_norm_eps=1e-5, rope_scaling=None, rope_theta=10000.0, use_qk_norm=False,
                   vocab_size=97)


def build_model():
    """The model kvaudit's worker runs the setup on: random weights where it builds one in code
    (mx.random.seed(0), float32), kvaudit's GGUF llama's weights otherwise."""
    if MODEL == "gguf":
        return gguf_llama()
    mx.random.seed(0)
    if MODEL == "llama4":
        from mlx_lm.models import llama4
        known = {f.name for f in dataclasses.fields(llama4.TextArgs)}
        text = {k: v for k, v in dict(LLAMA4_TEXT, attention_chunk_size=CHUNK_SIZE).items()
                if k in known}
        m = llama4.Model(llama4.ModelArgs(model_type="llama4", text_config=text))
    else:
        kw = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=WINDOW)
        if HEAD_DIM:
            kw["head_dim"] = HEAD_DIM
        args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2,
                               intermediate_size=128, num_attention_heads=4,
                               num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=97, **kw)
        m = llama.Model(args)
    mx.eval(m.parameters())
    return m


def blank(c):
    """A cache never written (keys is None)."""
    return c.keys is None


def evaluate(layers):
    """Evaluates a prompt cache's arrays (mlx is lazy: an error shows where it is evaluated)."""
    arrays = []
    for c in layers:
        for a in (c.keys, c.values):
            if a is not None:
                arrays.extend(a if isinstance(a, (tuple, list)) else [a])
    if arrays:
        mx.eval(arrays)


def offset(s):
    """The offset of sequence s's prompt cache (its full-attention layer's)."""
    return int(caches[s][BASE].offset)


def rows(a):
    if a is None:
        return 0
    if isinstance(a, (tuple, list)):  # a quantized triple (packed, scales, biases)
        return int(a[0].shape[-2])
    return int(a.shape[-2])


def ring_slots(n_rows, off, keep, idx):
    """The position each slot of a RotatingKVCache holds, from its update paths."""
    if off <= n_rows:
        return [s if s < off else None for s in range(n_rows)]
    out = []
    for s in range(n_rows):
        if s < keep:
            out.append(s)
        elif idx >= n_rows:
            out.append(off - (n_rows - s))
        elif s < idx:
            out.append(off - (idx - s))
        else:
            out.append(off - (idx - keep) - (n_rows - s))
    return out


def state_cells(c):
    """The positions one cache holds, read from its own `.state` (and `.meta_state`) alone."""
    name = type(c).__name__
    if META_STATE and blank(c):
        return []
    st = c.state
    meta = c.meta_state if META_STATE else None
    if name == "ConcatenateKVCache":
        return list(range(rows(st[0])))  # its state setter makes offset = rows
    if name in ("KVCache", "QuantizedKVCache"):
        n = rows(st[0])
        if META_STATE:
            n = n if name == "KVCache" else min(n, int(meta[0]))
        else:
            n = min(n, int(st[2]))
        return list(range(max(n, 0)))
    if name == "ChunkedKVCache":
        n = rows(st[0])
        if META_STATE:
            start = int(meta[1]) if meta else 0
        else:
            start = int(st[4])
            n = min(n, int(st[2]) - start)
        return list(range(start, start + max(n, 0)))
    if name == "RotatingKVCache":
        n = rows(st[0])
        if META_STATE:
            keep, _, off, idx = map(int, meta)
        else:
            off, keep, idx = int(st[2]), int(st[3]), int(st[5])
        return sorted(p for p in ring_slots(n, off, keep, idx) if p is not None)
    raise RuntimeError("no state reading for cache class %s" % name)


def accessors(c):
    """(pos_min, pos_max) as the cache's accessors say: offset, size(), keep."""
    off = int(c.offset)
    if off == 0:
        return -1, -1
    if type(c).__name__ == "RotatingKVCache":
        size = c.size() if SIZE else len(c)
        return (0 if c.keep > 0 else off - size), off - 1
    if type(c).__name__ == "ChunkedKVCache":
        return int(c.start_position), off - 1  # the positions before it were trimmed off
    return 0, off - 1


def observe(layers):
    """A sequence as kvaudit observes it: accessors, and the positions its state holds."""
    o = {"cells": state_cells(layers[BASE])}
    o["pos_min"], o["pos_max"] = accessors(layers[WIN if WIN is not None else BASE])
    if WIN is not None:
        o["second_cells"] = state_cells(layers[WIN])
    return o


def merge(layer, parts):
    """The caches of one layer of several sequences as one batch cache."""
    if KINDS[layer] == "plain":
        return C.BatchKVCache.merge(parts)
    return C.BatchRotatingKVCache.merge(parts)


def damaged(data, truncate, flip):
    """The bytes a damaged load sees: the first `truncate`, the byte at `flip` inverted."""
    out = bytearray(data if truncate is None else data[:truncate])
    if flip is not None and flip < len(out):
        out[flip] ^= 0xFF
    return bytes(out)


def write(layers, meta):
    """save_prompt_cache of `layers` with `meta`: the file's bytes."""
    fd, path = tempfile.mkstemp(suffix=".safetensors")
    os.close(fd)
    try:
        C.save_prompt_cache(path, layers, meta)
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


def read(data):
    """load_prompt_cache of the bytes `data`: (caches, metadata)."""
    fd, path = tempfile.mkstemp(suffix=".safetensors")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return C.load_prompt_cache(path, return_metadata=True)
    finally:
        os.unlink(path)


def written():
    return [s for s in range(N_SEQ) if not all(blank(c) for c in caches[s])]


def save_whole():
    """Every written sequence's prompt cache in one file (a live batch: its batch caches)."""
    ids = written()
    meta = {"kvaudit": "whole", "layers": str(N_LAYERS)}
    for s in ids:
        meta["tokens_%d" % s] = ",".join(map(str, tokens[s]))
    if BATCH and live is not None and list(live[0]) == ids:
        meta["batch"] = ",".join(map(str, ids))
        return write(list(live[1]), meta)
    meta["seqs"] = ",".join(map(str, ids))
    return write([c for s in ids for c in caches[s]], meta)


def save_seq(s):
    """Sequence s's prompt cache in one file (never written: a file of no caches)."""
    empty = all(blank(c) for c in caches[s])
    meta = {"kvaudit": "seq", "layers": "0" if empty else str(N_LAYERS),
            "tokens": ",".join(map(str, tokens[s]))}
    return write([] if empty else caches[s], meta)


class LoadFailed(Exception):
    """Damaged bytes the load rejected: it returns false and changes nothing."""


def load(data, intact):
    try:
        return read(data)
    except Exception:
        if intact:
            raise
        raise LoadFailed()


def ids_of(meta, key):
    text = meta.get(key, "")
    return [int(x) for x in text.split(",")] if text else []


def tokens_of(text):
    return [int(x) for x in text.split(",")] if text else []


def load_whole(data, intact):
    """A whole file back into every sequence; False when damaged bytes do not load."""
    global live
    try:
        loaded, meta = load(data, intact)
        n_layers = int(meta["layers"])
        if meta.get("kvaudit") != "whole" or n_layers != N_LAYERS:
            raise ValueError("not a whole dump of this setup")
        batch = "batch" in meta
        ids = ids_of(meta, "batch" if batch else "seqs")
        if len(loaded) != (n_layers if batch else n_layers * len(ids)):
            raise ValueError("%d caches" % len(loaded))
        toks = {s: tokens_of(meta["tokens_%d" % s]) for s in ids}
    except (KeyError, ValueError, LoadFailed):
        if intact:
            raise
        return False
    for s in range(N_SEQ):
        caches[s], tokens[s] = make_cache(), []
    live = None
    for i, s in enumerate(ids):
        caches[s] = [b.extract(i) for b in loaded] if batch else \
            loaded[i * n_layers:(i + 1) * n_layers]
        evaluate(caches[s])
        tokens[s] = toks[s]
    if batch and len(ids) > 1:
        live = (ids, loaded)
    return True


def load_seq(s, data, intact):
    """A sequence file into sequence s; False when damaged bytes do not load."""
    try:
        loaded, meta = load(data, intact)
        if meta.get("kvaudit") != "seq" or len(loaded) not in (0, N_LAYERS) \
                or int(meta["layers"]) != len(loaded):
            raise ValueError("not a sequence dump of this setup")
        toks = tokens_of(meta["tokens"])
    except (KeyError, ValueError, LoadFailed):
        if intact:
            raise
        return False
    caches[s] = loaded or make_cache()
    evaluate(caches[s])
    tokens[s] = toks
    return True


model = build_model()
caches = [make_cache() for _ in range(N_SEQ)]
tokens = [[] for _ in range(N_SEQ)]  # the token at each position of each sequence
slots = {}                           # saved files, by kvaudit's slot name
live = None                          # engine batch: (sequences, batch caches) of the last batch
returned = None                      # what the last seq_rm or load returned
