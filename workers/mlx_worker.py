#!/usr/bin/env python3
"""mlx-lm: kvaudit's worker for mlx-lm's KV caches (JSON-lines worker protocol, version 1).

kvaudit starts it as `VENV/bin/python -u mlx_worker.py` (target `mlx-lm@VERSION`). It speaks
docs/worker-protocol.md: `hello`, then `trial`s answered by one `step` per op and an `end`.
It imports the standard library, mlx and mlx_lm only, and runs on mlx-lm 0.32.x, 0.30.x and
0.28.x (the API differences are feature-detected at import; see `Api`).

The models (mlx_models.py, beside this file): the hello's option `models` maps an architecture
(`llama`, `llama_hd64`) to a GGUF file, kvaudit's tiny model of it (the very file its llama.cpp
targets load), read with mx.load and renamed to mlx-lm's llama names. A setup of arch llama with
a quantized cache runs the `llama_hd64` file (mx.quantize needs heads 64 wide). Without a file
for the setup's architecture (a worker started alone, arch gemma2): a tiny llama built in code,
random weights from mx.random.seed(0), float32, sliding-window layers for gemma2. Each model is
built once per distinct configuration and kept for the worker's life.

engine model=llama4 (with arch gemma2): mlx-lm's own llama4 text model (mlx_lm/models/llama4.py,
`llama4_model`), tiny and built in code (4 layers, random weights from mx.random.seed(0),
float32, attention_chunk_size = engine chunk_size, 4 by default) with its own make_cache:
ChunkedKVCache on layers 0-2, which the model front-trims (`maybe_trim_front`) before each
forward, and a KVCache on the global layer 3. kvaudit judges it by arch gemma2's shape: `cells`
are the global layer's, `second_cells` layer 0's, the accessors layer 0's (`start_position`,
`offset - 1`: what the model's chunk mask reads).

Mapping of kvaudit's ops onto mlx-lm (one kvaudit sequence = one prompt cache: a list of
per-layer caches of batch 1):
    decode (one sequence)    model(tokens, cache=the sequence's cache); the tokens land at the
                             cache's offset ("next" positions); an explicit other `pos`:
                             unsupported; beyond n_ctx tokens: rc 1; a bad sequence id or token: -1
    decode (several)         the same tokens into each; engine batch=true: the sequences' caches
                             merged into a BatchKVCache / BatchRotatingKVCache, decoded as one
                             batch, extracted back (the batch is kept and reused by the next decode
                             of the same sequences while none of them changed); sequences at
                             different offsets: unsupported (kvaudit puts the tokens at the same
                             positions in every sequence)
    seq_rm tail [p0, end)    trim_prompt_cache(cache, offset - p0) when can_trim_prompt_cache,
                             returning whether it returned that count ("return the number of
                             tokens that were trimmed", its docstring: fewer is a removal that
                             did not happen, llama.h's false), else refused (a wrapped
                             RotatingKVCache); p0 <= 0 on a cache that
                             cannot trim: the sequence gets a fresh cache (make_prompt_cache);
                             a range inside the sequence: unsupported
    seq_cp whole → empty     copy.deepcopy of the source's cache (what mlx-lm's LRUPromptCache
                             does); a partial copy or a non-empty destination: unsupported
    seq_keep                 the other sequences get fresh caches; batch=true: merge, filter,
                             extract
    clear                    fresh caches for every sequence
    state_save / _load       save_prompt_cache / load_prompt_cache of every written sequence in
                             one safetensors file (metadata names the sequences, their layer
                             count and their tokens); batch=true with a live batch of every
                             written sequence: the batch caches themselves
    state_seq_save / _load   the same for one sequence (a never-written one: a file of no caches,
                             which loads as a fresh cache); the load replaces the destination's
                             cache
    a load that raises       on damaged bytes: returned false, nothing changed; on intact bytes:
                             a crash (an exception of mlx-lm's)
Not there: seq_add, seq_div (no position shift in mlx-lm's caches).

Observation (cells_from "state"): the resident positions are derived from each cache's own
`.state` (and `.meta_state` before 0.32) alone, never from `offset` (see `state_cells`). With a
windowed model (arch gemma2) `cells` are the full-attention layer's and `second_cells` the
windowed layer's. pos_min/pos_max come from the cache's accessors (`offset`, `size()`, `keep`):
where they disagree with the state, both are reported as they are (kvaudit's I1).
"""

import copy
import json
import math
import os
import re
import sys
import tempfile
import traceback

import mlx.core as mx
import mlx_lm
from mlx_lm.models import cache as C

from mlx_models import LLAMA4_LAYERS, MODEL_FILES, MODEL_KINDS, ROPE, model_for

PROTOCOL = 1
ENGINE = "mlx-lm"
MAX_SEQS = 64
MAX_CTX = 1 << 16
VOCAB = 97
PROBE_TOKEN = 5  # kvaudit's probe token (src/base/tokens/mod.rs): both engines probe with it
PROBE_OFF = 1e-2
F32_MAX = 3.4028234663852886e38
SLOT_RE = re.compile(r"^[a-z0-9_]{1,16}$")
I32_MIN, I32_MAX, U32_MAX = -(1 << 31), (1 << 31) - 1, (1 << 32) - 1
STATE_SEQ_FLAGS_PARTIAL_ONLY = 1  # mlx-lm keeps no device-side state apart: ignored
# faults of the worker's own mapping and reading; then MLX_FAULTS, which patch mlx-lm itself
FAULTS = {"stale_offset", "trim_one_more", "load_drops_row", "probe_off",
          "raise_in_trim", "abort_in_trim", "rope_halves", "load_trims_first"}
# the architectures a GGUF file may be given for (hello option `models`)
GGUF_ARCHES = {"llama", "llama_hd64"}
ARCHES = {"llama", "llama_hd64", "gemma2", "mamba", "jamba", "lfm2", "lfm2_swa", "minimax-m3",
          "qwen4exp", "deepseek4", "glm-dsa", "deepseek32", "dots3note", "qwen4exp_ple"}
CACHE_TYPES = {"f16", "f32", "q8_0", "q4_0"}
CACHE_KINDS = ("plain", "rotating", "chunked", "concatenate", "quantized")
# engine keys: which cache kinds (or arch "gemma2") each one applies to
ENGINE_KEYS = {"cache": None, "batch": None, "model": None, "max_size": {"rotating"},
               "keep": {"rotating", "gemma2"}, "chunk_size": {"chunked", "llama4"},
               "bits": {"quantized"}, "group_size": {"quantized"}, "window": {"gemma2"}}
def _patch(cls, name, wrap):
    """Replaces cls.name by wrap(the original)."""
    setattr(cls, name, wrap(getattr(cls, name)))


def _ring_two_short(update):
    def update_and_fetch(self, keys, values):
        self.max_size -= 2
        try:
            return update(self, keys, values)
        finally:
            self.max_size += 2
    return update_and_fetch


def _trim_returns_less(trim):
    def trimmed(self, n):
        m = trim(self, n)
        return m - 1 if m > 0 else m
    return trimmed


def _trim_keeps_last(trim):
    def trimmed(self, n):
        trim(self, max(n - 1, 0))
        return n
    return trimmed


def _extract_drops_last(extract):
    def extracted(self, idx):
        c = extract(self, idx)
        if c.offset > 0:
            c.trim(1)
        return c
    return extracted


def _front_trims_two_more(maybe_trim_front):
    def front_trimmed(self):
        start = self.start_position
        maybe_trim_front(self)
        if self.start_position != start and self.offset - self.start_position > 2:
            self.start_position += 2
            self.keys, self.values = self.keys[..., 2:, :], self.values[..., 2:, :]
    return front_trimmed


# Faults that perturb mlx-lm itself, for positive controls that fire through the real engine:
# each patches one method of mlx-lm's cache classes in this worker's process at hello.
#   ring_two_short        RotatingKVCache updates as if max_size were 2 smaller: the ring evicts
#                         two positions early (I2 on a ring with keep, swa-window on gemma2)
#   trim_returns_less     KVCache.trim trims n, returns n - 1 (contract?: a seq_rm that reports
#                         failure changed the cache)
#   trim_keeps_last       KVCache.trim trims n - 1, returns n (differential against llama.cpp)
#   extract_drops_last    BatchKVCache.extract returns the row one token short
#                         (config-differential: batch=true against batch=false)
#   front_trims_two_more  ChunkedKVCache.maybe_trim_front drops two more valid rows than its
#                         chunk leaves (cache-invisible on llama4)
MLX_FAULTS = {
    "ring_two_short": (C.RotatingKVCache, "update_and_fetch", _ring_two_short),
    "trim_returns_less": (C.KVCache, "trim", _trim_returns_less),
    "trim_keeps_last": (C.KVCache, "trim", _trim_keeps_last),
    "extract_drops_last": (getattr(C, "BatchKVCache", None), "extract", _extract_drops_last),
    "front_trims_two_more": (C.ChunkedKVCache, "maybe_trim_front", _front_trims_two_more),
}
FAULTS |= set(MLX_FAULTS)


def version_tuple(text):
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


class Api:
    """What this mlx-lm has (feature-detected; research notes §1.3)."""
    version = getattr(mlx_lm, "__version__", "?")
    mlx_version = getattr(mx, "__version__", "?")
    # <= 0.31: `state` + `meta_state`, from_state(state, meta_state), state sliced to offset;
    # 0.32: scalars folded into `state`, KVCache.state holds the whole buffer and the offset.
    meta_state = hasattr(C._BaseCache, "meta_state")
    batch = hasattr(C, "BatchKVCache") and hasattr(C, "BatchRotatingKVCache")
    size = hasattr(C.KVCache, "size")          # 0.28.x: __len__ instead
    empty_save = None                          # does a file of no caches load back?


def _probe_empty_save():
    """Whether a prompt cache of no caches saves and loads back (0.32: yes; <= 0.31: the loader
    cannot unpack its metadata, and save_prompt_cache raises on a never-written KVCache)."""
    fd, path = tempfile.mkstemp(suffix=".safetensors", dir=TMPDIR)
    os.close(fd)
    try:
        C.save_prompt_cache(path, [], {"k": "v"})
        C.load_prompt_cache(path, return_metadata=True)
        return True
    except Exception:
        return False
    finally:
        os.unlink(path)


TMPDIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def default_token(i):
    """The default token id of a decode's i-th token (src/base/op.rs, `default_token`): 1..63."""
    return (i * 37 + 11) % 63 + 1


class Malformed(Exception):
    """A request that does not follow the protocol: answered `error`."""


class Unsupported(Exception):
    """A setting or op argument mlx-lm cannot honour: the trial ends `unsupported`."""


class Refused(Exception):
    """A call the engine rejects cleanly (outcome `refused`)."""


class LoadFailed(Exception):
    """Damaged bytes that the load rejected: the load returns false and changes nothing."""


# -- requests: strict parsing (as python_ref.py) --------------------------------------------------
def need_int(obj, key, lo=I32_MIN, hi=I32_MAX, default=Malformed):
    if key not in obj:
        if default is Malformed:
            raise Malformed("missing %r in %s" % (key, json.dumps(obj)))
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise Malformed("%r must be an integer in [%d, %d], got %r" % (key, lo, hi, v))
    return v


OP_FIELDS = {
    "seq_rm": ({"seq", "p0", "p1"}, set()), "seq_cp": ({"src", "dst", "p0", "p1"}, set()),
    "seq_keep": ({"seq"}, set()), "seq_add": ({"seq", "p0", "p1", "delta"}, set()),
    "seq_div": ({"seq", "p0", "p1", "d"}, set()), "clear": (set(), set()),
    "decode": ({"n"}, {"seq", "seqs", "pos", "tokens"}),
    "state_seq_save": ({"seq", "slot"}, {"flags"}),
    "state_seq_load": ({"seq", "slot"}, {"flags", "truncate", "flip"}),
    "state_save": ({"slot"}, set()), "state_load": ({"slot"}, {"truncate", "flip"}),
}
U32_FIELDS = {"n", "flags", "truncate", "flip"}
OPTIONAL_NULL = {"pos", "tokens", "truncate", "flip", "seqs"}


def parse_op(op):
    if not isinstance(op, dict) or op.get("op") not in OP_FIELDS:
        raise Malformed("not an op: %s" % json.dumps(op))
    op = {k: v for k, v in op.items() if v is not None or k not in OPTIONAL_NULL}
    required, optional = OP_FIELDS[op["op"]]
    keys = set(op) - {"op"}
    if not required <= keys or not keys <= required | optional:
        raise Malformed("fields of %s: need %s, may have %s" % (
            json.dumps(op), sorted(required), sorted(optional)))
    for k in keys - {"slot", "seqs", "tokens"}:
        need_int(op, k, *((0, U32_MAX) if k in U32_FIELDS else (I32_MIN, I32_MAX)))
    if "slot" in op and not (isinstance(op["slot"], str) and SLOT_RE.match(op["slot"])):
        raise Malformed("slot name %r: use 1 to 16 characters from [a-z0-9_]" % op.get("slot"))
    if op["op"] == "decode":
        if ("seq" in op) == ("seqs" in op):
            raise Malformed("decode: give \"seq\" or \"seqs\", not both or neither")
        for k in ("seqs", "tokens"):
            v = op.get(k, [])
            if not isinstance(v, list) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and I32_MIN <= x <= I32_MAX
                    for x in v):
                raise Malformed("decode: %r must be a list of integers" % k)
        if "seqs" in op and not op["seqs"]:
            raise Malformed("decode: \"seqs\" must not be empty")
        if op["n"] == 0:
            raise Malformed("decode: \"n\" must be at least 1")
        if "tokens" in op and len(op["tokens"]) != op["n"]:
            raise Malformed("decode: %d tokens given for n = %d" % (len(op["tokens"]), op["n"]))
    return op


SETUP_FIELDS = {"n_ctx", "n_seq_max", "kv_unified", "n_batch", "n_ubatch", "flash_attn",
                "type_k", "type_v", "arch", "swa_full", "n_rs_seq", "embd_input", "engine",
                "ops", "foreign"}


class Config:
    """A setup as mlx-lm caches: which cache class on which layer, and the worker's limits."""

    def __init__(self, s):
        if not isinstance(s, dict):
            raise Malformed("setup must be an object")
        extra = sorted(set(s) - SETUP_FIELDS)
        if extra:
            raise Malformed("unknown field %r in setup" % extra[0])
        self.n_ctx = need_int(s, "n_ctx", 0, U32_MAX, 256)
        self.n_seq_max = need_int(s, "n_seq_max", 0, U32_MAX, 4)
        for k in ("n_batch", "n_ubatch"):
            if s.get(k) is not None:
                need_int(s, k, 0, U32_MAX)
        n_rs_seq = need_int(s, "n_rs_seq", 0, U32_MAX, 0)
        flags = {k: s.get(k, d) for k, d in (("kv_unified", True), ("flash_attn", False),
                                             ("swa_full", True), ("embd_input", False))}
        for k, v in flags.items():
            if not isinstance(v, bool):
                raise Malformed("%r must be a boolean" % k)
        types = [s.get(k, "f16") for k in ("type_k", "type_v")]
        for t in types:
            if t not in CACHE_TYPES:
                raise Malformed("unknown cache type %r" % t)
        arch = s.get("arch", "llama")
        if arch not in ARCHES:
            raise Malformed("unknown architecture %r" % arch)
        engine = s.get("engine", {})
        if not isinstance(engine, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in engine.items()):
            raise Malformed("setup engine must be an object of strings to strings")
        ops, foreign = s.get("ops", []), s.get("foreign", [])
        if not isinstance(ops, list) or not isinstance(foreign, list):
            raise Malformed("setup ops and foreign must be lists")
        self.ops = [parse_op(o) for o in ops]
        # -- what mlx-lm can honour (the rest: unsupported) ---------------------------------------
        if arch not in ("llama", "llama_hd64", "gemma2"):
            raise Unsupported("arch %s: the mlx-lm worker runs a llama (KVCache layers) or a llama "
                              "with sliding-window layers (gemma2)" % arch)
        if not flags["kv_unified"]:
            raise Unsupported("kv_unified=false: mlx-lm has one cache per sequence and no "
                              "unified/split stream setting")
        if not flags["swa_full"]:
            raise Unsupported("swa_full=false: not a setting of mlx-lm's caches")
        if n_rs_seq > 0:
            raise Unsupported("n_rs_seq > 0: the mlx-lm worker's model has no recurrent states")
        if flags["embd_input"]:
            raise Unsupported("embd_input: the mlx-lm worker feeds token ids only")
        if foreign:
            raise Unsupported("foreign dumps: the mlx-lm worker has one configuration per trial")
        if not 1 <= self.n_seq_max <= MAX_SEQS or not 1 <= self.n_ctx <= MAX_CTX:
            raise Unsupported("n_ctx %d, n_seq_max %d: the mlx-lm worker takes 1..%d tokens and "
                              "1..%d sequences" % (self.n_ctx, self.n_seq_max, MAX_CTX, MAX_SEQS))
        if types[0] != types[1]:
            raise Unsupported("type_k %s != type_v %s: mlx-lm quantizes K and V alike" % tuple(types))
        self.cache_type = types[0]
        # the probe's tolerance class: a windowed cache (gemma2, or engine cache=rotating on
        # every layer) is "iswa", where chunked and token-by-token windows round differently
        self.memory = "iswa" if arch == "gemma2" or engine.get("cache") == "rotating" else "kv"
        for k in sorted(engine):
            if k not in ENGINE_KEYS:
                raise Unsupported("engine key %r is unknown to the mlx-lm worker (known: %s)"
                                  % (k, ", ".join(sorted(ENGINE_KEYS))))
        # engine model=llama4: mlx-lm's llama4 text model and its own make_cache (chunked layers
        # beside a global one). kvaudit judges it by arch gemma2's shape, a full cache beside a
        # windowed one: the chunked layers hold the last chunk_size positions (and the chunk
        # a token attends lies inside them), the global layer every position.
        self.llama4 = engine.get("model", "llama") == "llama4"
        if engine.get("model", "llama") not in MODEL_KINDS:
            raise Unsupported("engine model %r: one of %s" % (engine["model"],
                                                             ", ".join(MODEL_KINDS)))
        if self.llama4 and (arch != "gemma2" or "cache" in engine
                           or engine.get("batch", "false") != "false"):
            raise Unsupported("engine model=llama4 runs with arch gemma2 (a full cache beside "
                              "windowed ones), its own caches and no batch")
        kind = engine.get("cache")
        if kind is not None and kind not in CACHE_KINDS:
            raise Unsupported("engine cache %r: one of %s" % (kind, ", ".join(CACHE_KINDS)))
        quant = {"q8_0": 8, "q4_0": 4}.get(self.cache_type)
        if quant is not None:
            if kind not in (None, "quantized") or self.llama4:
                raise Unsupported("type %s with engine cache=%s: a quantized type is mlx-lm's "
                                  "QuantizedKVCache" % (self.cache_type, kind))
            kind = "quantized"
        kind = kind or ("llama4" if self.llama4 else "plain")
        if arch == "gemma2" and kind not in ("plain", "llama4"):
            raise Unsupported("arch gemma2 with cache %s: the windowed model takes "
                              "RotatingKVCache and KVCache layers only" % kind)
        self.kind = kind
        owner = "gemma2" if arch == "gemma2" and not self.llama4 else kind
        for k in sorted(engine):
            if ENGINE_KEYS[k] is not None and owner not in ENGINE_KEYS[k]:
                raise Unsupported("engine key %r does not apply to %s" % (
                    k, "arch gemma2" if owner == "gemma2" else "cache=" + kind))

        def num(key, default, lo, hi):
            text = engine.get(key)
            if text is None:
                return default
            try:
                v = int(text, 10)
            except ValueError:
                raise Unsupported("engine %s=%r: not an integer" % (key, text))
            if not lo <= v <= hi:
                raise Unsupported("engine %s=%d: outside [%d, %d]" % (key, v, lo, hi))
            return v

        self.batch = {"true": True, "false": False}.get(engine.get("batch", "false"))
        if self.batch is None:
            raise Unsupported("engine batch=%r: true or false" % engine["batch"])
        self.window = num("window", 8, 1, 4096) if owner == "gemma2" else None
        self.max_size = num("max_size", 8, 1, 4096) if kind == "rotating" else self.window
        self.keep = num("keep", 0, 0, 4095) if kind == "rotating" or owner == "gemma2" else 0
        if self.max_size is not None and self.keep >= self.max_size:
            raise Unsupported("keep %d >= max_size %d" % (self.keep, self.max_size))
        self.chunk_size = (num("chunk_size", 4, 1, 1 << 20) if kind in ("chunked", "llama4")
                           else None)
        self.bits = num("bits", quant or 8, 2, 8) if kind == "quantized" else None
        self.group_size = num("group_size", 32, 32, 128) if kind == "quantized" else None
        if quant is not None and self.bits != quant:
            raise Unsupported("type %s with engine bits=%d" % (self.cache_type, self.bits))
        if kind == "quantized" and (self.bits not in (2, 3, 4, 5, 6, 8)
                                    or self.group_size not in (32, 64, 128)):
            raise Unsupported("QuantizedKVCache bits %d group %d: mlx quantizes 2-6 or 8 bits in "
                              "groups of 32, 64 or 128" % (self.bits, self.group_size))
        # mx.quantize needs the head size divisible by the group: a 64-wide head variant
        self.head_dim = 64 if (arch == "llama_hd64" or kind == "quantized") else None
        if kind == "quantized" and 64 % self.group_size:
            raise Unsupported("group_size %d does not divide the head size 64" % self.group_size)
        if self.batch:
            if not Api.batch:
                raise Unsupported("batch=true: mlx-lm %s has no batch caches" % Api.version)
            if kind not in ("plain", "rotating"):
                raise Unsupported("batch=true with cache %s: mlx-lm batches KVCache and "
                                  "RotatingKVCache only (no merge for this class)" % kind)
        # layers: [windowed, full] for gemma2 (mlx-lm's layer_types order), else all alike
        # (one per model layer: `fit` sets the count once the model is known)
        self.kinds = ["rotating", "plain"] if arch == "gemma2" else [kind, kind]
        self.kind = kind
        self.windowed = arch == "gemma2" and not self.llama4
        # the layer whose positions are `cells`, the windowed one (`second_cells`): llama4's
        # global layer is its last, layer 0 the first chunked one (whose offset and
        # start_position the model's chunk mask reads)
        self.base = (LLAMA4_LAYERS - 1 if self.llama4 else 1) if arch == "gemma2" else 0
        self.win = 0 if arch == "gemma2" else None
        # kvaudit's GGUF model of the architecture, when the hello gave one (quantized: heads 64
        # wide, the llama_hd64 file); else the model built in code
        gguf = (MODEL_FILES.get("llama_hd64" if self.head_dim else arch)
                if not self.window and not self.llama4 else None)
        self.model_key = (("gguf", gguf) if gguf else ("llama4", self.chunk_size) if self.llama4
                          else (self.head_dim, self.window))
        self.cache_model = None  # llama4: the model whose make_cache makes the caches

    def fit(self, model):
        """One cache per layer of the model the setup runs: a prompt cache has a cache for each
        layer (make_prompt_cache), and a cache no layer writes would never be written. llama4:
        the model's own make_cache."""
        if self.llama4:
            self.cache_model = model
            self.kinds = ["chunked" if type(c).__name__ == "ChunkedKVCache" else "plain"
                          for c in model.make_cache()]
        elif not self.windowed:
            self.kinds = [self.kind] * len(model.layers)

    def make(self):
        """A fresh per-sequence prompt cache (llama4: `make_prompt_cache`, the model's own)."""
        if self.cache_model is not None:
            return C.make_prompt_cache(self.cache_model)
        out = []
        for k in self.kinds:
            if k == "plain":
                out.append(C.KVCache())
            elif k == "rotating":
                out.append(C.RotatingKVCache(self.max_size, self.keep))
            elif k == "chunked":
                out.append(C.ChunkedKVCache(self.chunk_size))
            elif k == "concatenate":
                out.append(C.ConcatenateKVCache())
            else:
                out.append(C.QuantizedKVCache(group_size=self.group_size, bits=self.bits))
        return out


# -- reading a cache: positions from its state, bounds from its accessors -------------------------
def is_blank(c):
    """A cache never written (mlx-lm's `empty()`: keys is None)."""
    return c.keys is None


def _rows(a):
    if a is None:
        return 0
    if isinstance(a, (tuple, list)):  # a quantized triple (packed, scales, biases)
        return int(a[0].shape[-2])
    return int(a.shape[-2])


def ring_slots(n_rows, offset, keep, idx):
    """The position each slot of a RotatingKVCache holds (research notes §2, derived from its
    update paths): a ring not yet full holds 0..offset-1 in slots 0..offset-1; after a
    concatenating update (idx == rows) the keep slots then offset-(rows-keep)..offset-1 in
    order; after in-place wraps (idx < rows) keep slots, then the newest in keep..idx-1 and the
    older ones in idx..rows-1."""
    if offset <= n_rows:
        return [s if s < offset else None for s in range(n_rows)]
    out = []
    for s in range(n_rows):
        if s < keep:
            out.append(s)
        elif idx >= n_rows:
            out.append(offset - (n_rows - s))
        elif s < idx:
            out.append(offset - (idx - s))
        else:
            out.append(offset - (idx - keep) - (n_rows - s))
    return out


def state_cells(c):
    """The positions a single cache holds, from its `.state` (and `.meta_state`) alone."""
    name = type(c).__name__
    if Api.meta_state and is_blank(c):
        return []  # <= 0.31: the state getter of a never-written cache raises
    st = c.state
    meta = c.meta_state if Api.meta_state else None
    if name == "ConcatenateKVCache":
        return list(range(_rows(st[0])))  # its state setter makes offset = rows
    if name in ("KVCache", "QuantizedKVCache"):
        rows = _rows(st[0])
        if Api.meta_state:
            n = rows if name == "KVCache" else min(rows, int(meta[0]))
        else:
            n = min(rows, int(st[2]))
        return list(range(max(n, 0)))
    if name == "ChunkedKVCache":
        rows = _rows(st[0])
        if Api.meta_state:
            start = int(meta[1]) if meta else 0
            n = rows
        else:
            offset, start = int(st[2]), int(st[4])
            n = min(rows, offset - start)
        return list(range(start, start + max(n, 0)))
    if name == "RotatingKVCache":
        rows = _rows(st[0])
        if Api.meta_state:
            keep, _max_size, offset, idx = map(int, meta)
        else:
            offset, keep, _max_size, idx = int(st[2]), int(st[3]), int(st[4]), int(st[5])
        return sorted(p for p in ring_slots(rows, offset, keep, idx) if p is not None)
    raise RuntimeError("mlx worker: no state reading for cache class %s" % name)


def cache_size(c):
    """`size()` where mlx-lm has it (0.30+), `len()` in 0.28."""
    if Api.size:
        return c.size()
    return len(c)


def accessors(c):
    """(pos_min, pos_max) from the cache's accessors: offset, size(), keep."""
    off = int(c.offset)
    if off == 0:
        return -1, -1
    if type(c).__name__ == "RotatingKVCache":
        return (0 if c.keep > 0 else off - cache_size(c)), off - 1
    if type(c).__name__ == "ChunkedKVCache":
        # the positions before start_position were trimmed off its front
        return int(c.start_position), off - 1
    return 0, off - 1


def cache_arrays(caches):
    out = []
    for c in caches:
        for a in (c.keys, c.values):
            if a is None:
                continue
            out.extend(a if isinstance(a, (tuple, list)) else [a])
    return out


def damaged(data, truncate, flip):
    """The bytes a damaged load sees (src/base/op.rs, `damaged`)."""
    out = bytearray(data if truncate is None else data[:truncate])
    if flip is not None and flip < len(out):
        out[flip] ^= 0xFF
    return bytes(out)


def batch_merge(kind, caches):
    # the Batch classes' own merge: KVCache.merge delegates to it from 0.30 (absent in 0.28)
    if kind == "plain":
        return C.BatchKVCache.merge(caches)
    return C.BatchRotatingKVCache.merge(caches)


# -- a set of sequences: the cache under test (or its twin) ---------------------------------------
class Store:
    def __init__(self, cfg, faults):
        self.cfg, self.faults, self.model = cfg, faults, model_for(cfg)
        cfg.fit(self.model)
        args = self.model.args
        self.vocab = getattr(args, "text_config", args).vocab_size  # llama4: its text config
        self.caches = [cfg.make() for _ in range(cfg.n_seq_max)]
        self.toks = [[] for _ in range(cfg.n_seq_max)]  # the token at each position, as the ops asked
        self.live = None   # (seq ids, batch caches): the batch of the last multi-sequence decode
        self.stale = {}    # fault stale_offset: seq -> the pos_max before its last trim
        self.slots = {}

    def twin(self):
        return Store(self.cfg, self.faults)

    def valid(self, s):
        return 0 <= s < self.cfg.n_seq_max

    def offset(self, s):
        return int(self.caches[s][self.cfg.base].offset)

    def eval(self, caches):
        arrays = cache_arrays(caches)
        if arrays:
            mx.eval(arrays)

    # -- observing ------------------------------------------------------------------------------
    def observe(self, s):
        cs, cfg = self.caches[s], self.cfg
        cells = state_cells(cs[cfg.base])
        acc = cs[cfg.win] if cfg.win is not None else cs[cfg.base]
        pos_min, pos_max = accessors(acc)
        if s in self.stale:
            pos_max = self.stale[s]
        o = {"seq": s, "pos_min": pos_min, "pos_max": pos_max, "cells": cells}
        if cfg.win is not None:
            o["second_cells"] = state_cells(cs[cfg.win])
        return o

    # -- ops --------------------------------------------------------------------------------------
    def decode(self, seqs, n, pos, tokens):
        seqs = list(dict.fromkeys(seqs))
        if not all(self.valid(s) for s in seqs):
            return -1
        toks = tokens if tokens is not None else [default_token(i) for i in range(n)]
        if not all(0 <= t < self.vocab for t in toks):
            return -1
        offs = [self.offset(s) for s in seqs]
        if len(set(offs)) > 1:
            raise Unsupported("decode into sequences at different offsets %s: mlx-lm places each "
                              "token at its own cache's offset" % offs)
        start = offs[0]
        if pos is not None and pos != start:
            raise Unsupported("decode at pos %d: mlx-lm places a token at its cache's offset (%d)"
                              % (pos, start))
        if start + n > self.cfg.n_ctx:
            return 1
        if len(seqs) > 1 and self.cfg.batch:
            ids = tuple(seqs)
            if self.live is not None and self.live[0] == ids:
                batch = self.live[1]
            else:
                batch = [batch_merge(k, [self.caches[s][l] for s in ids])
                         for l, k in enumerate(self.cfg.kinds)]
            self.live = None
            self.model(mx.array([toks] * len(ids)), cache=batch)
            self.eval(batch)
            for i, s in enumerate(ids):
                self.caches[s] = [b.extract(i) for b in batch]
            self.eval([c for s in ids for c in self.caches[s]])
            self.live = (ids, batch)
        else:
            self.live = None
            for s in seqs:
                self.model(mx.array([toks]), cache=self.caches[s])
                self.eval(self.caches[s])
        for s in seqs:
            self.toks[s] = self.toks[s][:start] + list(toks)
            self.stale.pop(s, None)
        return 0

    def trim(self, s, n):
        """trim_prompt_cache of one sequence (the faults hook in here): whether it trimmed the
        count it was asked for."""
        if "raise_in_trim" in self.faults:
            raise RuntimeError("injected fault raise_in_trim: trim raised")
        if "abort_in_trim" in self.faults:
            sys.stderr.write("injected fault abort_in_trim: aborting in trim\n")
            sys.stderr.flush()
            os.abort()
        if "trim_one_more" in self.faults:
            n += 1
        return C.trim_prompt_cache(self.caches[s], n) == n

    def seq_rm(self, seq, p0, p1):
        targets = list(range(self.cfg.n_seq_max)) if seq == -1 else [seq]
        lo, hi = max(p0, 0), (p1 if p1 >= 0 else I32_MAX + 1)
        plan, trimmed_all = [], True
        for s in targets:
            off = self.offset(s)
            if lo >= hi or lo >= off:
                continue  # nothing resident in the range
            if hi < off:
                raise Unsupported("seq_rm [%d, %d) inside seq %d of %d tokens: mlx-lm removes "
                                  "only a tail" % (p0, p1, s, off))
            trimmable = C.can_trim_prompt_cache(self.caches[s])
            if not trimmable and lo > 0:
                raise Refused("seq %d: can_trim_prompt_cache is false (%s): mlx-lm cannot "
                              "remove its tail" % (s, type(self.caches[s][0]).__name__))
            plan.append((s, off, trimmable))
        for s, off, trimmable in plan:
            if trimmable:
                # trim_prompt_cache "will trim the cache if possible ... and return the number
                # of tokens that were trimmed": fewer than asked is a removal that did not
                # happen (llama.h's false), whatever the layers did
                trimmed_all &= self.trim(s, off - lo)
            else:  # the whole sequence of a ring that cannot trim: a fresh cache
                self.caches[s] = self.cfg.make()
            self.eval(self.caches[s])
            self.toks[s] = self.toks[s][:lo]
            if "stale_offset" in self.faults:
                self.stale[s] = off - 1
            else:
                self.stale.pop(s, None)
        return trimmed_all

    def seq_cp(self, src, dst, p0, p1):
        if src == dst:
            return
        off = self.offset(src)
        if p0 > 0 or 0 <= p1 < off:
            raise Unsupported("seq_cp [%d, %d) of seq %d (%d tokens): mlx-lm copies a whole "
                              "cache" % (p0, p1, src, off))
        if self.offset(dst) != 0:
            raise Unsupported("seq_cp into seq %d, which holds %d tokens: an mlx-lm copy "
                              "replaces a cache, it cannot join two" % (dst, self.offset(dst)))
        self.caches[dst] = copy.deepcopy(self.caches[src])
        self.eval(self.caches[dst])
        self.toks[dst] = list(self.toks[src])
        self.stale.pop(dst, None)

    def seq_keep(self, seq):
        others = [s for s in range(self.cfg.n_seq_max) if s != seq]
        written = [s for s in range(self.cfg.n_seq_max)
                   if not all(is_blank(c) for c in self.caches[s])]
        if self.cfg.batch and seq in written:
            batch = [batch_merge(k, [self.caches[s][l] for s in written])
                     for l, k in enumerate(self.cfg.kinds)]
            i = written.index(seq)
            for b in batch:
                b.filter([i])
            self.caches[seq] = [b.extract(0) for b in batch]
            self.eval(self.caches[seq])
        for s in others:
            self.caches[s] = self.cfg.make()
            self.toks[s] = []
            self.stale.pop(s, None)

    def clear(self):
        self.caches = [self.cfg.make() for _ in range(self.cfg.n_seq_max)]
        self.toks = [[] for _ in range(self.cfg.n_seq_max)]
        self.stale = {}

    # -- state: save_prompt_cache / load_prompt_cache ---------------------------------------------
    def _write(self, caches, meta):
        fd, path = tempfile.mkstemp(suffix=".safetensors", dir=TMPDIR)
        os.close(fd)
        try:
            C.save_prompt_cache(path, caches, meta)
            with open(path, "rb") as f:
                return f.read()
        finally:
            os.unlink(path)

    def _read(self, data):
        fd, path = tempfile.mkstemp(suffix=".safetensors", dir=TMPDIR)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return C.load_prompt_cache(path, return_metadata=True)
        finally:
            os.unlink(path)

    def save_whole(self):
        written = [s for s in range(self.cfg.n_seq_max)
                   if not all(is_blank(c) for c in self.caches[s])]
        n_layers = len(self.cfg.kinds)
        meta = {"kvaudit": "whole", "layers": str(n_layers)}
        for s in written:
            meta["tokens_%d" % s] = ",".join(map(str, self.toks[s]))
        if not written and not Api.empty_save:
            raise Unsupported("state_save of a cache with nothing written: mlx-lm %s cannot save "
                              "or load a prompt cache of no caches" % Api.version)
        if self.cfg.batch and self.live is not None and list(self.live[0]) == written:
            meta["batch"] = ",".join(map(str, written))
            return self._write(list(self.live[1]), meta)
        meta["seqs"] = ",".join(map(str, written))
        return self._write([c for s in written for c in self.caches[s]], meta)

    def save_seq(self, s):
        if all(is_blank(c) for c in self.caches[s]) and not Api.empty_save:
            raise Unsupported("state_seq_save of seq %d, never written: mlx-lm %s can neither "
                              "save an empty cache nor load a file of no caches (fixed in 0.32)"
                              % (s, Api.version))
        blank = all(is_blank(c) for c in self.caches[s])
        meta = {"kvaudit": "seq", "layers": "0" if blank else str(len(self.cfg.kinds)),
                "tokens": ",".join(map(str, self.toks[s]))}
        # a never-written sequence is a dump of no caches, as the whole dump leaves it out
        return self._write([] if blank else self.caches[s], meta)

    def _load(self, data, intact):
        """load_prompt_cache of `data`: (caches, metadata); LoadFailed when damaged bytes raise."""
        try:
            caches, meta = self._read(data)
        except Exception:
            if intact:
                raise  # intact bytes that mlx-lm cannot read back: a crash (a finding)
            raise LoadFailed()
        return caches, meta

    def _meta_ids(self, meta, key):
        text = meta.get(key, "")
        return [int(x) for x in text.split(",")] if text else []

    def _tokens(self, text):
        return [int(x) for x in text.split(",")] if text else []

    def _drop_row(self, caches):
        if "load_drops_row" in self.faults:
            for c in caches:
                if not is_blank(c) and int(c.offset) > 0:
                    c.trim(1)

    def load_whole(self, data, intact=True):
        caches, meta = self._load(data, intact)
        try:
            n_layers = int(meta["layers"])
            if meta.get("kvaudit") != "whole" or n_layers != len(self.cfg.kinds):
                raise ValueError("not a whole dump of this setup")
            batch = "batch" in meta
            ids = self._meta_ids(meta, "batch" if batch else "seqs")
            if not all(self.valid(s) for s in ids) or len(set(ids)) != len(ids):
                raise ValueError("sequence ids %s" % ids)
            if len(caches) != (n_layers if batch else n_layers * len(ids)):
                raise ValueError("%d caches" % len(caches))
            toks = {s: self._tokens(meta["tokens_%d" % s]) for s in ids}
        except (KeyError, ValueError):
            if intact:
                raise
            raise LoadFailed()
        self.clear()
        self.live = None
        if batch:
            for i, s in enumerate(ids):
                self.caches[s] = [b.extract(i) for b in caches]
            if len(ids) > 1:
                self.live = (tuple(ids), caches)
        else:
            for i, s in enumerate(ids):
                self.caches[s] = caches[i * n_layers:(i + 1) * n_layers]
        for s in ids:
            self._drop_row(self.caches[s])
            self.eval(self.caches[s])
            self.toks[s] = toks[s]
        return True

    def load_seq(self, s, data, intact=True):
        caches, meta = self._load(data, intact)
        try:
            if meta.get("kvaudit") != "seq" or len(caches) not in (0, len(self.cfg.kinds)) \
                    or int(meta["layers"]) != len(caches):
                raise ValueError("not a sequence dump of this setup")
            toks = self._tokens(meta["tokens"])
        except (KeyError, ValueError):
            if intact:
                raise
            raise LoadFailed()
        caches = caches or self.cfg.make()
        self._drop_row(caches)
        self.caches[s] = caches
        self.eval(caches)
        self.toks[s] = toks
        self.stale.pop(s, None)
        return True

    # -- one op -----------------------------------------------------------------------------------
    def apply(self, op):
        """Runs one op; returns its outcome (OpOutcome JSON). Unsupported/Refused are raised by
        the op and turned into outcomes here."""
        kind = op["op"]
        try:
            return self._apply(kind, op)
        except Unsupported as e:
            return {"outcome": "unsupported", "reason": str(e)}
        except Refused as e:
            return {"outcome": "refused", "reason": str(e)}

    def _apply(self, kind, op):
        if kind in ("seq_add", "seq_div"):
            raise Unsupported(LACKS[kind])
        if op.get("flags", 0) & ~STATE_SEQ_FLAGS_PARTIAL_ONLY:
            raise Unsupported("state flags %d: mlx-lm keeps no device-side state apart"
                              % op["flags"])
        seq = op.get("seq")
        named = [op[k] for k in ("src", "dst") if k in op]
        if seq is not None and kind != "decode" and not (kind == "seq_rm" and seq == -1):
            named.append(seq)
        bad = [s for s in named if not self.valid(s)]
        if bad:
            raise Refused("sequence id %d outside [0, %d)" % (bad[0], self.cfg.n_seq_max))
        if kind not in ("decode", "state_save", "state_seq_save", "state_load"):
            self.live = None  # the batch no longer mirrors the sequences
        if kind == "decode":
            seqs = [seq] if "seq" in op else op["seqs"]
            return {"outcome": "decoded",
                    "rc": self.decode(seqs, op["n"], op.get("pos"), op.get("tokens"))}
        done = {"outcome": "done"}
        if kind == "seq_rm":
            done["returned"] = self.seq_rm(seq, op["p0"], op["p1"])
        elif kind == "seq_cp":
            self.seq_cp(op["src"], op["dst"], op["p0"], op["p1"])
        elif kind == "seq_keep":
            self.seq_keep(seq)
        elif kind == "clear":
            self.clear()
        elif kind == "state_save":
            self.slots[op["slot"]] = self.save_whole()
            done["returned"] = True
        elif kind == "state_seq_save":
            self.slots[op["slot"]] = self.save_seq(seq)
            done["returned"] = True
        elif kind in ("state_load", "state_seq_load"):
            if op["slot"] not in self.slots:
                raise Refused("slot '%s' holds nothing: no save into it in this trial" % op["slot"])
            raw = self.slots[op["slot"]]
            data = damaged(raw, op.get("truncate"), op.get("flip"))
            if "load_trims_first" in self.faults:
                # the destination's last token trimmed before the bytes are read, so a failed
                # load leaves it neither as it was nor empty (load_prompt_cache itself returns
                # new caches and cannot change a destination: a fault of the worker's mapping)
                for s in (range(self.cfg.n_seq_max) if kind == "state_load" else [seq]):
                    if self.offset(s) > 0 and C.can_trim_prompt_cache(self.caches[s]):
                        C.trim_prompt_cache(self.caches[s], 1)
                        self.toks[s] = self.toks[s][:-1]
            try:
                if kind == "state_load":
                    done["returned"] = self.load_whole(data, intact=data == raw)
                else:
                    done["returned"] = self.load_seq(seq, data, intact=data == raw)
            except LoadFailed:
                done["returned"] = False
        return done

    # -- observations beyond the sequences ----------------------------------------------------------
    def round_trip(self, seqs):
        whole = self.save_whole()
        twin = self.twin()
        out = {"whole_loaded": twin.load_whole(whole),
               "whole_twin": [twin.observe(s) for s in seqs]}
        out["whole_same_bytes"] = twin.save_whole() == whole
        out["seqs"] = []
        for s in seqs:
            data, twin = self.save_seq(s), self.twin()
            loaded = twin.load_seq(s, data)
            out["seqs"].append({"loaded": loaded, "twin": twin.observe(s),
                                "same_bytes": twin.save_seq(s) == data})
        return out

    def logits_probe(self, seqs, observed, vectors=None):
        """Per sequence with cells: the probe token's logits after a copy of its cache, against a
        fresh cache of the same setup that prefilled the sequence's tokens. The graphs of every
        probe are evaluated at once. `vectors`, a list: each probed sequence's cached logits are
        appended to it as `{"seq", "logits"}` (the step's `next_logits`)."""
        probe = mx.array([[PROBE_TOKEN]])
        rows, diffs, cached_logits = [], [], []
        for s, o in zip(seqs, observed):
            if not o["cells"] and not o.get("second_cells"):
                continue
            cached = copy.deepcopy(self.caches[s])
            a = self.model(probe, cache=cached)[0, -1]
            fresh = self.cfg.make()
            if self.toks[s]:
                self.model(mx.array([self.toks[s]]), cache=fresh)
            b = self.model(probe, cache=fresh)[0, -1]
            cached_logits.append(a.astype(mx.float32))
            if "probe_off" in self.faults:
                a = a + PROBE_OFF
            diffs.append(mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))))
            rows.append({"seq": s, "n_tokens": len(self.toks[s]),
                         "cache": self.cfg.cache_type, "memory": self.cfg.memory})
        if diffs:
            values = mx.stack(diffs).tolist()
            for row, d in zip(rows, values):
                row["max_abs_diff"] = d if math.isfinite(d) and d <= F32_MAX else F32_MAX
            if vectors is not None:
                for row, v in zip(rows, mx.stack(cached_logits).tolist()):
                    vectors.append({"seq": row["seq"], "logits": v})
        return [{"seq": r["seq"], "max_abs_diff": r["max_abs_diff"], "n_tokens": r["n_tokens"],
                 "cache": r["cache"], "memory": r["memory"]} for r in rows]


LACKS = {"seq_add": "mlx-lm caches have no position shift",
         "seq_div": "mlx-lm caches have no position shift"}


def capabilities():
    return {
        "ops": ["seq_rm", "seq_cp", "seq_keep", "clear", "decode", "state_seq_save",
                "state_seq_load", "state_save", "state_load"],
        "lacks": dict(LACKS), "cells_from": "state", "accessors": True, "before": True,
        "whole": False,
        # <= 0.31 cannot save a never-written cache (nor load a file of none), so an empty
        # sequence has no round trip there
        "round_trip": bool(Api.empty_save), "logits": True, "max_seqs": MAX_SEQS,
    }


class Crash(Exception):
    """An exception of mlx-lm's at a step: the trial ends `crashed` there."""

    def __init__(self, step):
        super().__init__(step)
        etype, evalue = sys.exc_info()[:2]
        text = " ".join(str(evalue).split())
        head = ("%s: %s" % (etype.__name__, text))[:80]
        tb = traceback.format_exc()
        self.step, self.message = step, "exception: " + head + "\n" + tb
        sys.stderr.write(tb)
        sys.stderr.flush()


# -- the worker ------------------------------------------------------------------------------------
class Worker:
    def __init__(self, out):
        self.out, self.faults = out, None

    def send(self, obj):
        self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self.out.flush()

    def hello(self, req):
        if self.faults is not None:
            raise Malformed("a second hello")
        if not isinstance(req, dict) or req.get("protocol") != PROTOCOL:
            raise Malformed("protocol %r: this worker speaks %d" % (
                req.get("protocol") if isinstance(req, dict) else req, PROTOCOL))
        faults, options = req.get("faults", []), req.get("options", {})
        if not isinstance(faults, list) or not isinstance(options, dict):
            raise Malformed("faults must be a list and options an object")
        unknown = [f for f in faults if f not in FAULTS]
        if unknown:
            raise Malformed("unknown fault %r (known: %s)" % (unknown[0], ", ".join(sorted(FAULTS))))
        unknown = sorted(set(options) - {"models"})
        if unknown:
            raise Malformed("unknown option %r (the mlx-lm worker takes: models)" % unknown[0])
        models = options.get("models", {})
        if not isinstance(models, dict) or not all(
                a in GGUF_ARCHES and isinstance(f, str) and os.path.isfile(f)
                for a, f in models.items()):
            raise Malformed("option models: an object of %s to GGUF files, got %s"
                            % (" or ".join(sorted(GGUF_ARCHES)), json.dumps(models)))
        MODEL_FILES.clear()
        MODEL_FILES.update(models)
        ROPE["traditional"] = "rope_halves" not in faults
        for f in sorted(set(faults) & set(MLX_FAULTS)):
            cls, name, wrap = MLX_FAULTS[f]
            if cls is None:
                raise Malformed("fault %s: mlx-lm %s has no batch caches" % (f, Api.version))
            _patch(cls, name, wrap)
        self.faults = frozenset(faults)
        self.send({"hello": {"protocol": PROTOCOL, "engine": ENGINE,
                             "version": "%s (mlx %s)" % (Api.version, Api.mlx_version),
                             "capabilities": capabilities()}})

    def trial(self, t):
        if self.faults is None:
            raise Malformed("a trial before hello")
        tid = t["id"]
        extra = sorted(set(t) - {"id", "setup", "ops", "seqs", "observe"})
        if extra:
            raise Malformed("unknown field %r in trial" % extra[0])
        observe = t.get("observe", {})
        if not isinstance(observe, dict) or not set(observe) <= {
                "before", "whole", "round_trip", "logits", "next_logits", "reload", "sizes",
                "partial"}:
            raise Malformed("observe: an object of before, whole, round_trip, logits, ...")
        if not isinstance(t.get("ops"), list):
            raise Malformed("trial ops must be a list")
        ops = [parse_op(o) for o in t["ops"]]
        try:
            cfg = Config(t.get("setup", {}))
        except Unsupported as e:
            return self.send({"end": {"id": tid, "end": {"end": "unsupported", "step": 0,
                                                        "reason": str(e)}}})
        seqs = t.get("seqs", list(range(cfg.n_seq_max)))
        if not isinstance(seqs, list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                                 and 0 <= s < cfg.n_seq_max for s in seqs):
            raise Malformed("seqs must be sequence ids in [0, %d)" % cfg.n_seq_max)
        try:
            try:
                store = Store(cfg, self.faults)
            except Exception:
                raise Crash(0)
            end = self.run(tid, store, cfg.ops, ops, seqs, observe)
        except Crash as c:
            end = {"end": "crashed", "step": c.step, "message": c.message}
        self.send({"end": {"id": tid, "end": end}})

    def run(self, tid, store, setup_ops, ops, seqs, observe):
        for op in setup_ops:
            try:
                outcome = store.apply(op)
            except Exception:
                raise Crash(0)
            if outcome["outcome"] == "unsupported":
                return {"end": "unsupported", "step": 0, "reason": outcome["reason"]}
            if outcome["outcome"] == "refused" or outcome.get("rc", 0) != 0:
                raise Malformed("setup op %s did not take effect: %s" % (json.dumps(op), outcome))
        store.stale = {}
        for step, op in enumerate(ops, 1):
            try:
                before = [store.observe(s) for s in seqs] if observe.get("before") else None
                outcome = store.apply(op)
                obs = [store.observe(s) for s in seqs]
                reply = {"id": tid, "step": step, "outcome": outcome, "seqs": obs}
                if outcome["outcome"] != "unsupported":
                    if before is not None:
                        reply["before"] = before
                    if observe.get("round_trip") and Api.empty_save:
                        reply["round_trip"] = store.round_trip(seqs)
                    if observe.get("logits") and step == len(ops):
                        vectors = [] if observe.get("next_logits") else None
                        reply["logits_probe"] = store.logits_probe(seqs, obs, vectors)
                        if vectors is not None:
                            reply["next_logits"] = vectors
            except Exception:
                raise Crash(step)
            self.send({"step": reply})
            if outcome["outcome"] == "unsupported":
                return {"end": "unsupported", "step": step, "reason": outcome["reason"]}
        return {"end": "completed"}

    def handle(self, line):
        req_id = None
        try:
            try:
                req = json.loads(line)
            except ValueError as e:
                raise Malformed("not JSON: %s" % e)
            if not isinstance(req, dict) or len(req) != 1:
                raise Malformed("a request is an object with one key: hello, trial or bye")
            (kind, body), = req.items()
            if kind == "bye":
                return False
            if kind == "hello":
                self.hello(body)
            elif kind == "trial":
                if not isinstance(body, dict):
                    raise Malformed("trial must be an object")
                req_id = body.get("id")
                if isinstance(req_id, bool) or not isinstance(req_id, int):
                    req_id = None
                    raise Malformed("trial id must be an integer")
                self.trial(body)
            else:
                raise Malformed("unknown request %r" % kind)
        except Malformed as e:
            self.send({"error": {"id": req_id, "message": str(e)}})
        except Exception:
            message = traceback.format_exc()
            sys.stderr.write(message)
            self.send({"error": {"id": req_id, "message": "the mlx-lm worker is broken: " + message}})
        return True


def main():
    out = sys.stdout
    sys.stdout = sys.stderr  # a stray print can never corrupt the protocol stream
    Api.empty_save = _probe_empty_save()
    worker = Worker(out)
    stdin = sys.stdin.buffer
    while True:
        raw = stdin.readline()
        if not raw:
            return
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            worker.send({"error": {"id": None, "message": "request is not UTF-8"}})
            continue
        if line and not worker.handle(line):
            return


if __name__ == "__main__":
    main()
