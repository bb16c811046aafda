#!/usr/bin/env python3
"""python-ref: kvaudit's pure-Python reference worker (JSON-lines worker protocol, version 1).

It drives a small model of llama.cpp's unified KV cell cache (`n_ctx` cells, each empty or
holding a position, a token and a set of sequence ids) through the protocol of
docs/worker-protocol.md: `hello`, then `trial`s answered by one `step` per op and an `end`.
It proves the protocol (standard library only, Python 3.9+) and carries injected faults as
positive controls (`--inject`, hello's `faults`), each one a defect an oracle must catch.

Semantics follow llama.h, with llama.cpp's unified single-stream cache where llama.h is silent
(targets/native-kv is the Rust model of the same): ranges are [p0, p1), p0 < 0 meaning 0 and
p1 < 0 unbounded; a cell shared by several sequences has one position, so `seq_add` moves it for
all of them, and a cell pushed below position 0 is removed. Decodes take the first free cells
from index 0; "next" positions start at the first sequence's `seq_pos_max + 1` (the accessor).
Not modelled: `seq_div` (declared lacking), llama_batch_allocr's position-consistency checks
(Y = X + 1, coupled sequences), padding of n_ctx, device-side state (`ON_DEVICE` flag).

State format (little-endian), the same for a whole dump and a sequence dump:
    magic  b"KVPY"      4 bytes
    u16    version = 1
    u8     kind: 0 whole context, 1 one sequence
    u8     reserved = 0
    u32    n_cells
    n_cells times:  i32 pos, i32 token, u32 n_seqs, n_seqs x i32 seq id (strictly ascending)
    u32    CRC-32 (zlib.crc32) of every byte before it
Cells are listed in cell-index order. A sequence dump lists its cells with n_seqs = 0 (they
belong to the sequence the load names, as in llama.cpp's per-sequence dump); a whole dump lists
each used cell with all its sequences (n_seqs >= 1). A whole load puts the cells at indices 0..
in dump order, so re-saving a loaded dump gives the same bytes; a sequence load empties the
destination and puts the cells in the first free cells (a dump of no cells changes nothing, as
in llama.cpp).

The promise on loads: the bytes are parsed and checked in full (magic, version, kind, length,
checksum, positions >= 0, sequence ids in range, room in the cache) before the cache is touched.
A load that fails any check returns false and leaves the cache exactly as it was; so does every
truncated or flipped buffer (the checksum and the exact length catch each one).
"""

import json
import os
import re
import struct
import sys
import time
import traceback
import zlib

ENGINE, VERSION, PROTOCOL = "python-ref", "1", 1
MAX_SEQS = 64
MAX_CTX = 1 << 20
OPS = ["seq_rm", "seq_cp", "seq_keep", "seq_add", "clear", "decode",
       "state_seq_save", "state_seq_load", "state_save", "state_load"]
CAPABILITIES = {
    "ops": OPS,
    "lacks": {"seq_div": "the reference cache has no position division"},
    "cells_from": "state", "accessors": True, "before": True, "whole": True,
    "round_trip": True, "logits": False, "max_seqs": MAX_SEQS,
}
FAULTS = {"stale_max", "keep_leaks", "load_drops_last",
          "raise_on_clear", "abort_on_clear", "hang_on_clear"}
MAGIC, FORMAT_VERSION, WHOLE, SEQ = b"KVPY", 1, 0, 1
HEADER, CELL, U32 = struct.Struct("<4sHBBI"), struct.Struct("<iiI"), struct.Struct("<I")
I32_MIN, I32_MAX, U32_MAX = -(1 << 31), (1 << 31) - 1, (1 << 32) - 1
STATE_SEQ_FLAGS_PARTIAL_ONLY = 1  # a plain KV cache ignores it, as llama.cpp's does

ARCHES = {"llama", "llama_hd64", "gemma2", "mamba", "jamba", "lfm2", "lfm2_swa", "minimax-m3",
          "qwen4exp", "deepseek4", "glm-dsa", "deepseek32", "dots3note", "qwen4exp_ple"}
CACHE_TYPES = {"f16", "f32", "q8_0", "q4_0"}
SLOT_RE = re.compile(r"^[a-z0-9_]{1,16}$")


def default_token(i):
    """The default token id of a decode's i-th token (src/base/op.rs, `default_token`)."""
    return (i * 37 + 11) % 63 + 1


class LoadError(Exception):
    """Bytes that a load rejects: the load returns false and changes nothing."""


class Malformed(Exception):
    """A request that does not follow the protocol: answered `error`."""


class Unsupported(Exception):
    """A setting the reference cache cannot honour: answered `end unsupported`."""


class Cache:
    """The cell cache. `cells[i]` is None (empty) or [pos, token, set of seq ids]."""

    def __init__(self, n_ctx, n_seq_max, faults=frozenset()):
        self.n_ctx, self.n_seq_max, self.faults = n_ctx, n_seq_max, frozenset(faults)
        self.cells = [None] * n_ctx
        self.cached_max = {}  # seq -> pos_max, the accessor's answer under `stale_max`

    def twin(self):
        """An empty cache of the same shape and faults (the round trip loads into it)."""
        return Cache(self.n_ctx, self.n_seq_max, self.faults)

    def used(self):
        return ((i, c) for i, c in enumerate(self.cells) if c is not None)

    def valid_seq(self, seq):
        return 0 <= seq < self.n_seq_max

    # -- accessors (`llama_memory_seq_pos_min/max`) ----------------------------------------------
    def positions(self, seq):
        return [c[0] for _, c in self.used() if seq in c[2]]

    def seq_pos_min(self, seq):
        return min(self.positions(seq), default=-1)

    def seq_pos_max(self, seq):
        if "stale_max" in self.faults:
            return self.cached_max.get(seq, -1)
        return max(self.positions(seq), default=-1)

    def refresh_max(self):
        """Recomputes the cached maxima; every op that changes cells calls it (only `stale_max`
        reads them)."""
        if "stale_max" in self.faults:
            self.cached_max = {}
            for _, c in self.used():
                for s in c[2]:
                    self.cached_max[s] = max(self.cached_max.get(s, -1), c[0])

    # -- memory ops --------------------------------------------------------------------------------
    def seq_rm(self, seq, p0, p1):
        lo, hi = max(p0, 0), (p1 if p1 >= 0 else I32_MAX + 1)
        for i, c in self.used():
            if lo <= c[0] < hi:
                if seq == -1:
                    c[2].clear()
                else:
                    c[2].discard(seq)
                if not c[2]:
                    self.cells[i] = None
        # Positive control `stale_max` (I1): seq_rm does not lower the cached maxima.
        if "stale_max" not in self.faults:
            self.refresh_max()
        return True

    def seq_cp(self, src, dst, p0, p1):
        lo, hi = max(p0, 0), (p1 if p1 >= 0 else I32_MAX + 1)
        if src != dst:
            for _, c in self.used():
                if src in c[2] and lo <= c[0] < hi:
                    c[2].add(dst)
        self.refresh_max()

    def seq_keep(self, seq):
        keep = {seq}
        if "keep_leaks" in self.faults:
            # Positive control (contract's "seq_keep: other sequence kept", I1/conservation): the
            # lowest-numbered other sequence present keeps its cells too.
            others = sorted({s for _, c in self.used() for s in c[2]} - keep)
            keep.update(others[:1])
        for i, c in self.used():
            c[2].intersection_update(keep)
            if not c[2]:
                self.cells[i] = None
        self.refresh_max()

    def seq_add(self, seq, p0, p1, delta):
        lo, hi = max(p0, 0), (p1 if p1 >= 0 else I32_MAX + 1)
        if delta == 0 or lo == hi:
            return
        for i, c in self.used():
            if seq in c[2] and lo <= c[0] < hi:
                # The cell moves for every sequence sharing it; llama_pos arithmetic is i32.
                c[0] = (c[0] + delta - I32_MIN) % (1 << 32) + I32_MIN
                if c[0] < 0:
                    self.cells[i] = None
        self.refresh_max()

    def clear(self):
        if "raise_on_clear" in self.faults:
            # Positive control (crash oracle): an engine exception; the worker answers `crashed`.
            raise RuntimeError("injected fault raise_on_clear: clear raised")
        if "abort_on_clear" in self.faults:
            # Positive control (crash oracle): the process dies of SIGABRT; kvaudit sees the signal.
            os.abort()
        if "hang_on_clear" in self.faults:
            # Positive control (crash oracle, hang): kvaudit's 20 s timeout must kill the worker.
            while True:
                time.sleep(3600)
        self.cells = [None] * self.n_ctx
        self.refresh_max()

    def decode(self, seqs, n, pos, tokens):
        """`llama_decode`: 0 placed, 1 no room (nothing written), -1 an invalid batch."""
        if n == 0 or not seqs or not all(self.valid_seq(s) for s in seqs):
            return -1
        start = self.seq_pos_max(seqs[0]) + 1 if pos is None else pos
        if start < 0 or start + n - 1 > I32_MAX:
            return -1
        free = [i for i, c in enumerate(self.cells) if c is None][:n]
        if len(free) < n:
            return 1
        for k, i in enumerate(free):
            tok = tokens[k] if tokens is not None else default_token(k)
            self.cells[i] = [start + k, tok, set(seqs)]
        self.refresh_max()
        return 0

    # -- state: serialize and parse ----------------------------------------------------------------
    def state_bytes(self, seq=None):
        """The whole dump (`seq` None) or one sequence's dump, in the format of the docstring."""
        out = []
        for _, c in self.used():
            if seq is None:
                ids = sorted(c[2])
                out.append(CELL.pack(c[0], c[1], len(ids)) + struct.pack("<%di" % len(ids), *ids))
            elif seq in c[2]:
                out.append(CELL.pack(c[0], c[1], 0))
        body = HEADER.pack(MAGIC, FORMAT_VERSION, WHOLE if seq is None else SEQ, 0, len(out))
        body += b"".join(out)
        return body + U32.pack(zlib.crc32(body) & U32_MAX)

    def parse(self, data, kind):
        """[(pos, token, [seqs])] of a dump of `kind`, or LoadError. Checks everything a load
        needs except room; never touches the cache."""
        if len(data) < HEADER.size + U32.size:
            raise LoadError("%d bytes: shorter than a header" % len(data))
        body, (crc,) = data[:-U32.size], U32.unpack(data[-U32.size:])
        magic, version, got_kind, reserved, n_cells = HEADER.unpack_from(body)
        if magic != MAGIC or version != FORMAT_VERSION or reserved != 0:
            raise LoadError("bad magic or version")
        if got_kind != kind:
            raise LoadError("a %s dump where a %s dump was expected"
                            % (("whole", "sequence")[got_kind == SEQ], ("whole", "sequence")[kind]))
        if zlib.crc32(body) & U32_MAX != crc:
            raise LoadError("checksum mismatch")
        if n_cells > self.n_ctx:
            raise LoadError("%d cells for a cache of %d" % (n_cells, self.n_ctx))
        cells, at = [], HEADER.size
        for _ in range(n_cells):
            if at + CELL.size > len(body):
                raise LoadError("cut inside the cells")
            pos, tok, n_seqs = CELL.unpack_from(body, at)
            at += CELL.size
            if at + 4 * n_seqs > len(body):
                raise LoadError("cut inside a cell's sequences")
            ids = list(struct.unpack_from("<%di" % n_seqs, body, at))
            at += 4 * n_seqs
            if pos < 0:
                raise LoadError("negative position %d" % pos)
            if (kind == SEQ) != (n_seqs == 0) or ids != sorted(set(ids)) \
                    or not all(self.valid_seq(s) for s in ids):
                raise LoadError("bad sequence list %r" % ids)
            cells.append((pos, tok, ids))
        if at != len(body):
            raise LoadError("%d bytes after the cells" % (len(body) - at))
        return cells

    def read_for_load(self, data, kind):
        cells = self.parse(data, kind)
        if cells and "load_drops_last" in self.faults:
            # Positive control (round-trip): a load loses the last cell it read.
            cells.pop()
        return cells

    def state_load(self, data):
        """`llama_state_set_data`: the cache becomes the dump's cells at indices 0.., or stays as
        it was (returns False)."""
        try:
            cells = self.read_for_load(data, WHOLE)
        except LoadError:
            return False
        self.cells = [[p, t, set(ids)] for p, t, ids in cells] + [None] * (self.n_ctx - len(cells))
        self.refresh_max()
        return True

    def state_seq_load(self, seq, data):
        """`llama_state_seq_set_data` into `seq`: emptied, then given the dump's cells in the
        first free cells; or nothing changes (returns False). A dump of no cells loads and
        changes nothing, as in llama.cpp (`state_read` skips a stream of cell_count 0 before
        its `seq_rm` of the destination)."""
        try:
            if not self.parse(data, SEQ):
                return True
            cells = self.read_for_load(data, SEQ)
        except LoadError:
            return False
        freed = [c is None or c[2] == {seq} for c in self.cells]
        if sum(freed) < len(cells):
            return False
        self.seq_rm(seq, -1, -1)
        free = [i for i, c in enumerate(self.cells) if c is None]
        for i, (p, t, _) in zip(free, cells):
            self.cells[i] = [p, t, {seq}]
        self.refresh_max()
        return True


# -- requests: strict parsing ---------------------------------------------------------------------
def need_int(obj, key, lo=I32_MIN, hi=I32_MAX, default=Malformed):
    """obj[key], an integer in [lo, hi]; `default` when absent (Malformed: required)."""
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
    """An op's JSON (src/base/op.rs) checked as serde checks it: a dict with its fields."""
    if not isinstance(op, dict) or op.get("op") not in OP_FIELDS:
        raise Malformed("not an op: %s" % json.dumps(op))
    # serde reads null as an absent Option (pos, tokens, truncate, flip, seq/seqs of a decode)
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
        if "tokens" in op and len(op["tokens"]) != op["n"]:
            raise Malformed("decode: %d tokens given for n = %d" % (len(op["tokens"]), op["n"]))
    return op


SETUP_FIELDS = {"n_ctx", "n_seq_max", "kv_unified", "n_batch", "n_ubatch", "flash_attn",
                "type_k", "type_v", "arch", "swa_full", "n_rs_seq", "embd_input", "ops", "foreign"}


def parse_setup(s):
    """(n_ctx, n_seq_max, setup ops); Malformed for a bad field, Unsupported for one the
    reference cache cannot honour. Cache types, flash attention and batch sizes change nothing
    in a positional model: accepted."""
    if not isinstance(s, dict):
        raise Malformed("setup must be an object")
    extra = sorted(set(s) - SETUP_FIELDS)
    if extra:
        raise Malformed("unknown field %r in setup" % extra[0])
    n_ctx = need_int(s, "n_ctx", 0, U32_MAX, 256)
    n_seq_max = need_int(s, "n_seq_max", 0, U32_MAX, 4)
    for k in ("n_batch", "n_ubatch"):
        if s.get(k) is not None:
            need_int(s, k, 0, U32_MAX)
    n_rs_seq = need_int(s, "n_rs_seq", 0, U32_MAX, 0)
    flags = {k: s.get(k, d) for k, d in (("kv_unified", True), ("flash_attn", False),
                                         ("swa_full", True), ("embd_input", False))}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise Malformed("%r must be a boolean" % k)
    for k in ("type_k", "type_v"):
        if s.get(k, "f16") not in CACHE_TYPES:
            raise Malformed("unknown cache type %r" % s.get(k))
    arch = s.get("arch", "llama")
    if arch not in ARCHES:
        raise Malformed("unknown architecture %r" % arch)
    ops, foreign = s.get("ops", []), s.get("foreign", [])
    if not isinstance(ops, list) or not isinstance(foreign, list):
        raise Malformed("setup ops and foreign must be lists")
    ops = [parse_op(o) for o in ops]
    if arch not in ("llama", "llama_hd64"):
        raise Unsupported("arch %s: the reference cache is one attention KV cache" % arch)
    for k, why in (("kv_unified", "one stream per sequence"), ("swa_full", "a windowed cache")):
        if not flags[k]:
            raise Unsupported("%s=false: the reference cache has no %s" % (k, why))
    if n_rs_seq > 0:
        raise Unsupported("n_rs_seq > 0: the reference cache has no recurrent states")
    if flags["embd_input"]:
        raise Unsupported("embd_input: the reference cache takes token ids only")
    if foreign:
        raise Unsupported("foreign dumps: the reference cache has one configuration")
    if not 1 <= n_seq_max <= MAX_SEQS or not 1 <= n_ctx <= MAX_CTX:
        raise Unsupported("n_ctx %d, n_seq_max %d: the reference cache takes 1..%d cells and "
                          "1..%d sequences" % (n_ctx, n_seq_max, MAX_CTX, MAX_SEQS))
    return n_ctx, n_seq_max, ops


# -- running ops and observing ---------------------------------------------------------------------
def damaged(data, truncate, flip):
    """The bytes a damaged load sees (src/base/op.rs, `damaged`)."""
    out = bytearray(data if truncate is None else data[:truncate])
    if flip is not None and flip < len(out):
        out[flip] ^= 0xFF
    return bytes(out)


def apply_op(cache, slots, op):
    """Runs one op on `cache` with the trial's `slots`; returns its outcome (OpOutcome JSON)."""
    kind, refuse = op["op"], (lambda why: {"outcome": "refused", "reason": why})
    seq = op.get("seq")
    if kind == "seq_div":
        return {"outcome": "unsupported", "reason": CAPABILITIES["lacks"]["seq_div"]}
    if op.get("flags", 0) & ~STATE_SEQ_FLAGS_PARTIAL_ONLY:
        return {"outcome": "unsupported", "reason": "state flags %d: the reference cache keeps "
                "no device-side state" % op["flags"]}
    named = [op[k] for k in ("src", "dst") if k in op]
    if seq is not None and kind != "decode" and not (kind == "seq_rm" and seq == -1):
        named.append(seq)
    bad = [s for s in named if not cache.valid_seq(s)]
    if bad:
        return refuse("sequence id %d outside [0, %d)" % (bad[0], cache.n_seq_max))
    if kind in ("state_seq_load", "state_load"):
        if op["slot"] not in slots:
            return refuse("slot '%s' holds nothing: no save into it in this trial" % op["slot"])
        data = damaged(slots[op["slot"]], op.get("truncate"), op.get("flip"))
    if kind == "decode":
        seqs = [seq] if "seq" in op else op["seqs"]
        return {"outcome": "decoded",
                "rc": cache.decode(seqs, op["n"], op.get("pos"), op.get("tokens"))}
    done = {"outcome": "done"}
    if kind == "seq_rm":
        done["returned"] = cache.seq_rm(seq, op["p0"], op["p1"])
    elif kind == "seq_cp":
        cache.seq_cp(op["src"], op["dst"], op["p0"], op["p1"])
    elif kind == "seq_keep":
        cache.seq_keep(seq)
    elif kind == "seq_add":
        cache.seq_add(seq, op["p0"], op["p1"], op["delta"])
    elif kind == "clear":
        cache.clear()
    elif kind in ("state_seq_save", "state_save"):
        slots[op["slot"]] = cache.state_bytes(seq)
        done["returned"] = True
    elif kind == "state_seq_load":
        done["returned"] = cache.state_seq_load(seq, data)
    elif kind == "state_load":
        done["returned"] = cache.state_load(data)
    return done


def observe_seq(cache, seq):
    """One SeqObservation: cells read back from the sequence's own dump, bounds from the
    accessors."""
    cells = sorted(p for p, _, _ in cache.parse(cache.state_bytes(seq), SEQ))
    return {"seq": seq, "pos_min": cache.seq_pos_min(seq), "pos_max": cache.seq_pos_max(seq),
            "cells": cells}


def observe_whole(cache):
    return [{"pos": p, "seqs": ids} for p, _, ids in cache.parse(cache.state_bytes(), WHOLE)]


def round_trip(cache, seqs):
    """The state saved now and loaded into an empty twin, whole and then per sequence."""
    whole = cache.state_bytes()
    twin = cache.twin()
    out = {"whole_loaded": twin.state_load(whole),
           "whole_twin": [observe_seq(twin, s) for s in seqs],
           "whole_same_bytes": twin.state_bytes() == whole, "seqs": []}
    for s in seqs:
        data, twin = cache.state_bytes(s), cache.twin()
        loaded = twin.state_seq_load(s, data)
        out["seqs"].append({"loaded": loaded, "twin": observe_seq(twin, s),
                            "same_bytes": twin.state_bytes(s) == data})
    return out


class Crash(Exception):
    """An exception of the model at a step: the trial ends `crashed` there."""

    def __init__(self, step):
        super().__init__(step)
        last = "".join(traceback.format_exception_only(*sys.exc_info()[:2])).strip()
        self.step, self.message = step, last + "\n" + traceback.format_exc()
        sys.stderr.write(traceback.format_exc())
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
            raise Malformed("unknown fault %r (known: %s)"
                            % (unknown[0], ", ".join(sorted(FAULTS))))
        if options:
            raise Malformed("unknown option %r (python-ref takes none)" % sorted(options)[0])
        self.faults = frozenset(faults)
        self.send({"hello": {"protocol": PROTOCOL, "engine": ENGINE, "version": VERSION,
                             "capabilities": CAPABILITIES}})

    def trial(self, t):
        if self.faults is None:
            raise Malformed("a trial before hello")
        tid = t["id"]
        extra = sorted(set(t) - {"id", "setup", "ops", "seqs", "observe"})
        if extra:
            raise Malformed("unknown field %r in trial" % extra[0])
        observe = t.get("observe", {})
        if not isinstance(observe, dict) or not set(observe) <= {
                "before", "whole", "round_trip", "logits", "reload", "sizes", "partial"}:
            raise Malformed("observe: an object of before, whole, round_trip, logits, ...")
        if not isinstance(t.get("ops"), list):
            raise Malformed("trial ops must be a list")
        ops = [parse_op(o) for o in t["ops"]]
        try:
            n_ctx, n_seq_max, setup_ops = parse_setup(t.get("setup", {}))
        except Unsupported as e:
            return self.send({"end": {"id": tid, "end": {"end": "unsupported", "step": 0,
                                                        "reason": str(e)}}})
        seqs = t.get("seqs", list(range(n_seq_max)))
        if not isinstance(seqs, list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                                 and 0 <= s < n_seq_max for s in seqs):
            raise Malformed("seqs must be sequence ids in [0, %d)" % n_seq_max)
        cache, slots = Cache(n_ctx, n_seq_max, self.faults), {}
        try:
            end = self.run(tid, cache, slots, setup_ops, ops, seqs, observe)
        except Crash as c:
            end = {"end": "crashed", "step": c.step, "message": c.message}
        self.send({"end": {"id": tid, "end": end}})

    def run(self, tid, cache, slots, setup_ops, ops, seqs, observe):
        """Setup, then each op and its step; returns the trial's end. Model exceptions become
        Crash at the step they happened in."""
        for op in setup_ops:
            try:
                outcome = apply_op(cache, slots, op)
            except Exception:
                raise Crash(0)
            if outcome["outcome"] == "unsupported":
                return {"end": "unsupported", "step": 0, "reason": outcome["reason"]}
            if outcome["outcome"] == "refused" or outcome.get("rc", 0) != 0:
                raise Malformed("setup op %s did not take effect: %s" % (json.dumps(op), outcome))
        for step, op in enumerate(ops, 1):
            try:
                before = [observe_seq(cache, s) for s in seqs] if observe.get("before") else None
                outcome = apply_op(cache, slots, op)
                reply = {"id": tid, "step": step, "outcome": outcome,
                         "seqs": [observe_seq(cache, s) for s in seqs]}
                if before is not None:
                    reply["before"] = before
                if observe.get("whole"):
                    reply["whole"] = observe_whole(cache)
                if observe.get("round_trip"):
                    reply["round_trip"] = round_trip(cache, seqs)
            except Exception:
                raise Crash(step)
            self.send({"step": reply})
            if outcome["outcome"] == "unsupported":
                return {"end": "unsupported", "step": step, "reason": outcome["reason"]}
        return {"end": "completed"}

    def handle(self, line):
        """Answers one request line; returns False at `bye`."""
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
            self.send({"error": {"id": req_id, "message": "python-ref is broken: " + message}})
        return True


def main():
    out = sys.stdout
    sys.stdout = sys.stderr  # a stray print can never corrupt the protocol stream
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
