"""Tests of workers/mlx_worker.py, run as kvaudit runs it: a subprocess spoken to in JSON lines.

    python3 -m unittest workers/test_mlx_worker.py -v

The worker runs under the interpreter of KVAUDIT_TEST_MLX_PYTHON, which must be set: the python of
an environment kvaudit made (`kvaudit target build mlx-lm@0.32.2` prints it; the `it` test binary's
`workers::` tests set it). Point it at another version's environment to test an older mlx-lm. Tests
of what an older version cannot do are skipped there, by the capabilities the worker declares.
"""

import json
import os
import queue
import subprocess
import threading
import unittest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlx_worker.py")
PYTHON = os.environ.get("KVAUDIT_TEST_MLX_PYTHON")
if not PYTHON:
    raise SystemExit(
        "set KVAUDIT_TEST_MLX_PYTHON to the python of an mlx-lm environment "
        "(kvaudit target build mlx-lm@0.32.2 prints it)"
    )
TIMEOUT = 60.0


class Worker:
    """A running mlx_worker.py: send requests, read replies with a timeout."""

    def __init__(self, faults=(), hello=True, options=None):
        self.proc = subprocess.Popen(
            [PYTHON, "-u", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        self.lines, self.stderr = queue.Queue(), []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()
        self.hello = None
        if hello:
            self.send({"hello": {"protocol": 1, "faults": list(faults), "options": options or {}}})
            self.hello = self.recv()

    def _pump(self):
        for raw in self.proc.stdout:
            self.lines.put(raw)
        self.lines.put(None)

    def send(self, obj):
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def recv(self, timeout=TIMEOUT):
        raw = self.lines.get(timeout=timeout)
        if raw is None:
            return None
        return json.loads(raw)  # every stdout line must be JSON

    def trial(self, ops, setup=None, seqs=(0, 1), observe=None, tid=1):
        """Runs a trial; returns (steps, end) where steps are the step bodies and end the last
        reply (an `end`, an `error`, or None when the worker died)."""
        self.send({"trial": {
            "id": tid,
            "setup": setup if setup is not None else {"n_ctx": 64, "n_seq_max": 2, "ops": []},
            "ops": ops, "seqs": list(seqs),
            "observe": observe or {"before": False, "whole": False, "round_trip": False,
                                   "logits": False}}})
        steps = []
        while True:
            reply = self.recv()
            if reply is None or "end" in reply or "error" in reply:
                return steps, reply
            assert reply["step"]["id"] == tid
            steps.append(reply["step"])

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


def decode(seq, n, **kw):
    return dict({"op": "decode", "seq": seq, "n": n}, **kw)


def rm(seq, p0, p1=-1):
    return {"op": "seq_rm", "seq": seq, "p0": p0, "p1": p1}


def by_seq(step):
    """A step's (or a list's) sequence observations by sequence id."""
    return {o["seq"]: o for o in (step["seqs"] if isinstance(step, dict) else step)}


def setup(n=0, **kw):
    s = {"n_ctx": 64, "n_seq_max": 2, "ops": [decode(0, n)] if n else []}
    s.update(kw)
    return s


COMPLETED = {"end": "completed"}
BEFORE = {"before": True, "whole": False, "round_trip": False, "logits": False}
LOGITS = {"before": False, "whole": False, "round_trip": False, "logits": True}
ROUND_TRIP = {"before": False, "whole": False, "round_trip": True, "logits": False}


class MlxWorkerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.shared = Worker()
        cls.caps = cls.shared.hello["hello"]["capabilities"]
        cls.next_id = 100

    @classmethod
    def tearDownClass(cls):
        cls.shared.close()

    def run_trial(self, ops, setup=None, seqs=(0, 1), observe=None):
        """A trial on the shared worker (no faults)."""
        MlxWorkerTest.next_id += 1
        tid = MlxWorkerTest.next_id
        steps, end = self.shared.trial(ops, setup=setup, seqs=seqs, observe=observe, tid=tid)
        self.assertIsNotNone(end, "the worker died")
        self.assertNotIn("error", end, end)
        return steps, end["end"]["end"]

    def worker(self, faults=(), hello=True):
        w = Worker(faults, hello)
        self.addCleanup(w.close)
        return w

    # -- hello ------------------------------------------------------------------------------------
    def test_hello_declares_the_capabilities(self):
        h = self.shared.hello["hello"]
        self.assertEqual((h["protocol"], h["engine"]), (1, "mlx-lm"))
        self.assertRegex(h["version"], r"^\d+\.\d+\.\d+ \(mlx \d+\.\d+\.\d+\)$")
        caps = self.caps
        for op in ("seq_add", "seq_div"):
            self.assertNotIn(op, caps["ops"])
            self.assertEqual(caps["lacks"][op], "mlx-lm caches have no position shift")
        self.assertEqual(sorted(caps["ops"]), sorted([
            "seq_rm", "seq_cp", "seq_keep", "clear", "decode", "state_seq_save",
            "state_seq_load", "state_save", "state_load"]))
        self.assertEqual(caps["cells_from"], "state")
        for k in ("accessors", "before", "logits"):
            self.assertIs(caps[k], True, k)
        self.assertIs(caps["whole"], False)
        self.assertEqual(set(caps), {"ops", "lacks", "cells_from", "accessors", "before", "whole",
                                     "round_trip", "logits", "max_seqs"})

    def test_unknown_fault_and_malformed_requests_are_errors(self):
        w = self.worker(hello=False)
        w.send({"hello": {"protocol": 1, "faults": ["no_such_fault"], "options": {}}})
        self.assertIn("unknown fault", w.recv()["error"]["message"])
        w.send({"hello": {"protocol": 1, "faults": [], "options": {}}})
        self.assertIn("hello", w.recv())
        _, end = w.trial([], setup={"n_ctxx": 16}, tid=3)
        self.assertIn("n_ctxx", end["error"]["message"])
        _, end = w.trial([], setup={"n_ctx": 4, "n_seq_max": 2, "ops": [decode(0, 5)]}, tid=5)
        self.assertIn("did not take effect", end["error"]["message"])
        w.send({"bye": {}})
        self.assertIsNone(w.recv())
        self.assertEqual(w.proc.wait(timeout=TIMEOUT), 0)

    def test_setups_it_cannot_honour_are_unsupported(self):
        for s, words in ((setup(engine={"colour": "blue"}), "'colour'"),
                         (setup(arch="mamba"), "arch mamba"),
                         (setup(type_k="q8_0"), "type_k q8_0 != type_v f16"),
                         (setup(kv_unified=False), "kv_unified"),
                         (setup(engine={"keep": "2"}), "does not apply"),
                         (setup(engine={"cache": "quantized", "batch": "true"}), "batch")):
            steps, end = self.shared.trial([decode(0, 1)], setup=s, tid=9)
            self.assertEqual(steps, [])
            self.assertEqual(end["end"]["end"]["end"], "unsupported", s)
            self.assertEqual(end["end"]["end"]["step"], 0)
            self.assertIn(words, end["end"]["end"]["reason"])

    # -- ops --------------------------------------------------------------------------------------
    def test_decode_and_tail_seq_rm_give_the_right_cells_and_accessors(self):
        steps, end = self.run_trial([rm(0, 4), decode(0, 2), rm(-1, 0), decode(1, 3)],
                                    setup=setup(7), observe=BEFORE)
        self.assertEqual(end, COMPLETED)
        s1, s2, s3, s4 = steps
        self.assertEqual(s1["outcome"], {"outcome": "done", "returned": True})
        self.assertEqual(by_seq(s1)[0], {"seq": 0, "pos_min": 0, "pos_max": 3, "cells": [0, 1, 2, 3]})
        self.assertEqual(by_seq(s1)[1], {"seq": 1, "pos_min": -1, "pos_max": -1, "cells": []})
        self.assertEqual(by_seq(s1["before"])[0]["cells"], list(range(7)))
        self.assertEqual(s2["outcome"], {"outcome": "decoded", "rc": 0})
        self.assertEqual(by_seq(s2)[0]["cells"], list(range(6)))
        self.assertEqual(by_seq(s3)[0], {"seq": 0, "pos_min": -1, "pos_max": -1, "cells": []})
        self.assertEqual(by_seq(s4)[1]["cells"], [0, 1, 2])

    def test_decode_limits(self):
        steps, end = self.run_trial([decode(0, 2), decode(0, 1, pos=5), decode(1, 1)],
                                    setup=setup(7, n_ctx=8))
        self.assertEqual(steps[0]["outcome"], {"outcome": "decoded", "rc": 1})  # 9 > n_ctx 8
        self.assertEqual(steps[1]["outcome"]["outcome"], "unsupported")
        self.assertIn("offset", steps[1]["outcome"]["reason"])
        self.assertEqual(end, {"end": "unsupported", "step": 2,
                               "reason": steps[1]["outcome"]["reason"]})
        steps, _ = self.run_trial([{"op": "decode", "seq": 5, "n": 1}], setup=setup(1))
        self.assertEqual(steps[0]["outcome"], {"outcome": "decoded", "rc": -1})

    def test_interior_seq_rm_is_unsupported(self):
        steps, end = self.run_trial([rm(0, 2, 4)], setup=setup(7))
        self.assertEqual(steps[0]["outcome"]["outcome"], "unsupported")
        self.assertIn("mlx-lm removes only a tail", steps[0]["outcome"]["reason"])
        self.assertEqual(end["end"], "unsupported")

    def test_seq_cp_and_seq_keep(self):
        steps, end = self.run_trial(
            [{"op": "seq_cp", "src": 0, "dst": 1, "p0": 0, "p1": -1}, decode(1, 1),
             {"op": "seq_keep", "seq": 1},
             {"op": "seq_cp", "src": 1, "dst": 0, "p0": 0, "p1": 3}], setup=setup(5))
        self.assertEqual(by_seq(steps[0])[1]["cells"], list(range(5)))
        self.assertEqual(by_seq(steps[1])[1]["cells"], list(range(6)))
        self.assertEqual(by_seq(steps[2])[0]["cells"], [])
        self.assertEqual(by_seq(steps[2])[1]["cells"], list(range(6)))
        self.assertEqual(steps[3]["outcome"]["outcome"], "unsupported")
        self.assertEqual(end["end"], "unsupported")

    def test_a_damaged_load_returns_false_and_changes_nothing(self):
        ops = [{"op": "state_seq_save", "seq": 0, "slot": "a"}, decode(0, 2),
               {"op": "state_seq_load", "seq": 0, "slot": "a", "truncate": 40},
               {"op": "state_seq_load", "seq": 0, "slot": "a", "flip": 3},
               {"op": "state_save", "slot": "b"},
               {"op": "state_load", "slot": "b", "truncate": 100},
               {"op": "state_seq_load", "seq": 1, "slot": "a"}]
        steps, end = self.run_trial(ops, setup=setup(5))
        self.assertEqual(end, COMPLETED)
        self.assertEqual(steps[0]["outcome"], {"outcome": "done", "returned": True})
        for i in (2, 3, 5):
            self.assertEqual(steps[i]["outcome"], {"outcome": "done", "returned": False}, i)
            self.assertEqual(by_seq(steps[i])[0]["cells"], list(range(7)))
        self.assertEqual(steps[6]["outcome"], {"outcome": "done", "returned": True})
        self.assertEqual(by_seq(steps[6])[1]["cells"], list(range(5)))

    def test_the_round_trip(self):
        if not self.caps["round_trip"]:
            self.skipTest("round_trip not declared by this mlx-lm")
        steps, end = self.run_trial([rm(0, 3), decode(1, 2)], setup=setup(6), observe=ROUND_TRIP)
        self.assertEqual(end, COMPLETED)
        for st in steps:
            rt = st["round_trip"]
            self.assertTrue(rt["whole_loaded"])
            self.assertTrue(rt["whole_same_bytes"])
            self.assertEqual(rt["whole_twin"], st["seqs"])
            for o, r in zip(st["seqs"], rt["seqs"]):
                self.assertEqual(r, {"loaded": True, "twin": o, "same_bytes": True})

    def test_logits_probe_is_exact_on_a_plain_cache_after_trim(self):
        steps, end = self.run_trial([rm(0, 4), decode(0, 3), decode(1, 2)], setup=setup(9),
                                    observe=LOGITS)
        self.assertEqual(end, COMPLETED)
        self.assertNotIn("logits_probe", steps[0])
        probes = steps[-1]["logits_probe"]
        self.assertEqual([p["seq"] for p in probes], [0, 1])
        for p, n in zip(probes, (7, 2)):
            self.assertLess(p["max_abs_diff"], 1e-6)
            self.assertEqual((p["n_tokens"], p["cache"], p["memory"]), (n, "f16", "kv"))

    def test_rotating_cache_past_its_window(self):
        # max_size 6: 4 tokens, then one at a time to 13 (in place, wrapping), then a chunk of 3
        for keep in (0, 2):
            s = setup(4, engine={"cache": "rotating", "max_size": "6", "keep": str(keep)})
            steps, end = self.run_trial([decode(0, 1)] * 9 + [decode(0, 3)], setup=s,
                                        observe=LOGITS)
            self.assertEqual(end, COMPLETED)
            o = by_seq(steps[8])[0]  # offset 13, ring of 6 slots
            self.assertEqual(o["cells"], list(range(keep)) + list(range(13 - 6 + keep, 13)))
            self.assertEqual((o["pos_min"], o["pos_max"]), (0 if keep else 7, 12))
            o = by_seq(steps[9])[0]  # a chunk of 3: the ring grows to 6 + 3 - 1 rows
            self.assertEqual(o["cells"], list(range(keep)) + list(range(16 - 8 + keep, 16)))
            # size() is the logical window (min(offset, max_size)), not the rows held
            self.assertEqual((o["pos_min"], o["pos_max"]), (0 if keep else 10, 15))
            probe = steps[-1]["logits_probe"][0]
            self.assertEqual((probe["memory"], probe["n_tokens"]), ("iswa", 16))
            if keep == 0:
                self.assertLess(probe["max_abs_diff"], 2e-6)
            # a wrapped ring cannot trim: refused
            steps, _ = self.run_trial([decode(0, 1)] * 9 + [rm(0, 10)], setup=s)
            self.assertEqual(steps[-1]["outcome"]["outcome"], "refused")

    def test_windowed_model_reports_both_layers(self):
        s = setup(4, arch="gemma2", engine={"window": "6"})
        steps, end = self.run_trial([decode(0, 1)] * 9, setup=s, observe=LOGITS)
        self.assertEqual(end, COMPLETED)
        o = by_seq(steps[-1])[0]
        self.assertEqual(o["cells"], list(range(13)))
        self.assertEqual(o["second_cells"], list(range(7, 13)))
        self.assertEqual((o["pos_min"], o["pos_max"]), (7, 12))
        self.assertLess(steps[-1]["logits_probe"][0]["max_abs_diff"], 2e-6)

    def test_llama4_runs_its_own_chunked_and_global_caches(self):
        # mlx-lm's llama4: ChunkedKVCache(4) on layers 0-2 (front trimmed before each forward),
        # KVCache on layer 3; cells are the global layer's, second_cells layer 0's
        s = setup(7, arch="gemma2", engine={"model": "llama4", "chunk_size": "4"})
        steps, end = self.run_trial([decode(0, 1), rm(0, 2)], setup=s, seqs=(0,), observe=LOGITS)
        self.assertEqual(end, COMPLETED)
        slid, trimmed = by_seq(steps[0])[0], by_seq(steps[1])[0]
        self.assertEqual(slid["cells"], list(range(8)))
        version = tuple(int(x) for x in self.shared.hello["hello"]["version"].split()[0].split("."))
        if version >= (0, 32):
            # #1673 fixed: the front trim keeps the last 4 valid positions
            self.assertEqual(slid["second_cells"], [3, 4, 5, 6, 7])
            self.assertEqual((slid["pos_min"], slid["pos_max"]), (3, 7))
            # #1494 A/C: trim 6 trims 5 on the chunked layers (layer 0's count is returned),
            # 6 on the global one: the worker's seq_rm returns false, the layers disagree
            self.assertEqual(steps[1]["outcome"], {"outcome": "done", "returned": False})
            self.assertEqual((trimmed["cells"], trimmed["second_cells"]), ([0, 1], []))
            self.assertEqual(trimmed["pos_max"], 2)
            self.assertGreater(steps[1]["logits_probe"][0]["max_abs_diff"], 0.1)
        else:
            # #1673: the front trim by the 256-row buffer's width: start_position 252
            self.assertEqual(slid["second_cells"], [252, 253, 254, 255])
            self.assertEqual(slid["pos_min"], 252)
        steps, end = self.run_trial([rm(0, 3)], setup=s, seqs=(0,), observe=LOGITS)
        self.assertEqual(steps[0]["outcome"], {"outcome": "done", "returned": True})
        self.assertEqual(by_seq(steps[0])[0]["second_cells"], [0, 1, 2])
        self.assertEqual(steps[0]["logits_probe"][0]["max_abs_diff"], 0.0)
        for bad in ({"model": "llama4"}, {"model": "llama4", "cache": "plain"}):
            _, end = self.shared.trial([decode(0, 1)], setup=setup(arch="llama" if len(bad) == 1
                                                                   else "gemma2", engine=bad), tid=9)
            self.assertEqual(end["end"]["end"]["end"], "unsupported")
            self.assertIn("llama4", end["end"]["end"]["reason"])

    def test_batch_decode_of_two_sequences(self):
        for engine in ({}, {"batch": "true"}):
            s = setup(0, engine=engine, ops=[decode(0, 5), decode(1, 5, tokens=[3, 4, 5, 6, 7])])
            steps, end = self.run_trial(
                [{"op": "decode", "seqs": [0, 1], "n": 2}, {"op": "decode", "seqs": [0, 1], "n": 1},
                 {"op": "seq_keep", "seq": 1}, decode(1, 1)], setup=s, observe=LOGITS)
            self.assertEqual(end, COMPLETED, engine)
            self.assertEqual(steps[0]["outcome"], {"outcome": "decoded", "rc": 0})
            for o in steps[1]["seqs"]:
                self.assertEqual(o["cells"], list(range(8)))
            self.assertEqual(by_seq(steps[2])[0]["cells"], [])
            self.assertEqual(by_seq(steps[3])[1]["cells"], list(range(9)))
            for p in steps[-1]["logits_probe"]:
                self.assertLess(p["max_abs_diff"], 1e-6, engine)
        # sequences at different offsets cannot take the same positions
        steps, end = self.run_trial([{"op": "decode", "seqs": [0, 1], "n": 1}], setup=setup(3))
        self.assertEqual(end["end"], "unsupported")

    def test_quantized_cache(self):
        s = setup(9, type_k="q8_0", type_v="q8_0")
        steps, end = self.run_trial([rm(0, 5), decode(0, 2)], setup=s, observe=LOGITS)
        self.assertEqual(end, COMPLETED)
        self.assertEqual(by_seq(steps[0])[0]["cells"], list(range(5)))
        p = steps[-1]["logits_probe"][0]
        self.assertEqual((p["cache"], p["max_abs_diff"]), ("q8_0", 0.0))

    # -- faults: each is caught by the reply field its oracle reads -------------------------------
    def test_fault_stale_offset(self):
        w = self.worker(["stale_offset"])
        steps, _ = w.trial([rm(0, 3)], setup=setup(7))
        o = by_seq(steps[0])[0]
        self.assertEqual(o["cells"], [0, 1, 2])
        self.assertNotEqual(o["pos_max"], max(o["cells"]))  # I1
        self.assertEqual(o["pos_max"], 6)

    def test_fault_trim_one_more(self):
        w = self.worker(["trim_one_more"])
        steps, _ = w.trial([rm(0, 3)], setup=setup(7), observe=BEFORE)
        # the op promises [0, 3) stay: the contract sees [0, 2)
        self.assertEqual(by_seq(steps[0]["before"])[0]["cells"], list(range(7)))
        self.assertEqual(by_seq(steps[0])[0]["cells"], [0, 1])

    def test_faults_that_patch_mlx_lm(self):
        # each patches one method of mlx-lm's classes in the worker's process
        w = self.worker(["trim_returns_less"])
        steps, _ = w.trial([rm(0, 3)], setup=setup(7))
        self.assertEqual(steps[0]["outcome"], {"outcome": "done", "returned": False})
        self.assertEqual(by_seq(steps[0])[0]["cells"], [0, 1, 2])
        w = self.worker(["trim_keeps_last"])
        steps, _ = w.trial([rm(0, 3)], setup=setup(7))
        self.assertEqual(steps[0]["outcome"], {"outcome": "done", "returned": True})
        self.assertEqual(by_seq(steps[0])[0]["cells"], [0, 1, 2, 3])
        w = self.worker(["ring_two_short"])
        s = setup(7, engine={"cache": "rotating", "max_size": "8", "keep": "2"})
        steps, _ = w.trial([decode(0, 1)], setup=s)
        self.assertEqual(by_seq(steps[0])[0]["cells"], [0, 1, 4, 5, 6, 7])  # 2 and 3 evicted
        w = self.worker(["load_trims_first"])
        steps, _ = w.trial([{"op": "state_seq_save", "seq": 0, "slot": "a"},
                            {"op": "state_seq_load", "seq": 0, "slot": "a", "truncate": 12}],
                           setup=setup(7))
        self.assertEqual(steps[1]["outcome"], {"outcome": "done", "returned": False})
        self.assertEqual(by_seq(steps[1])[0]["cells"], list(range(6)))

    def test_fault_load_drops_row(self):
        w = self.worker(["load_drops_row"])
        if not w.hello["hello"]["capabilities"]["round_trip"]:
            self.skipTest("round_trip not declared by this mlx-lm")
        steps, _ = w.trial([decode(0, 1)], setup=setup(5), observe=ROUND_TRIP)
        rt = steps[0]["round_trip"]
        self.assertEqual(by_seq(steps[0])[0]["cells"], list(range(6)))
        self.assertEqual(rt["whole_twin"][0]["cells"], list(range(5)))
        self.assertEqual(rt["seqs"][0]["twin"]["cells"], list(range(5)))

    def test_a_gguf_model_and_the_next_token_logits(self):
        # kvaudit's GGUF tiny llama (KVAUDIT_TEST_MLX_GGUF, the `it` binary sets it): its
        # vocabulary is the file's (64), and the logits come back when asked
        gguf = os.environ.get("KVAUDIT_TEST_MLX_GGUF")
        if not gguf:
            self.skipTest("KVAUDIT_TEST_MLX_GGUF names no GGUF model")
        observe = dict(LOGITS, next_logits=True)
        runs = {}
        for faults in ((), ("rope_halves",)):
            w = Worker(faults, options={"models": {"llama": gguf}})
            self.addCleanup(w.close)
            steps, end = w.trial([decode(0, 6)], setup=setup(5), observe=observe)
            self.assertEqual(end["end"]["end"], COMPLETED)
            (vec,) = steps[-1]["next_logits"]
            self.assertEqual((vec["seq"], len(vec["logits"])), (0, 64))
            self.assertLess(steps[-1]["logits_probe"][0]["max_abs_diff"], 1e-5)
            runs[faults] = vec["logits"]
        # the other RoPE layout changes the logits of a token past position 0
        self.assertGreater(max(abs(a - b) for a, b in zip(runs[()], runs[("rope_halves",)])), 1e-2)
        w = Worker(hello=False)
        self.addCleanup(w.close)
        w.send({"hello": {"protocol": 1, "faults": [], "options": {"models": {"gemma2": gguf}}}})
        self.assertIn("error", w.recv())

    def test_a_one_layer_gguf_model_gets_one_cache_a_sequence(self):
        # a prompt cache has one cache per model layer: with a cache no layer writes, a save of
        # it or a batch merge raised (the corpus files on concatenate and batch caches caught it)
        gguf = os.environ.get("KVAUDIT_TEST_MLX_GGUF")
        if not gguf:
            self.skipTest("KVAUDIT_TEST_MLX_GGUF names no GGUF model")
        w = Worker([], options={"models": {"llama": gguf}})
        self.addCleanup(w.close)
        ops = [{"op": "state_save", "slot": "a"}, rm(0, 2), {"op": "state_load", "slot": "a"}]
        steps, end = w.trial(ops, setup=setup(5, engine={"cache": "concatenate"}))
        self.assertEqual(end["end"]["end"], COMPLETED)
        self.assertEqual(steps[2]["outcome"], {"outcome": "done", "returned": True})
        self.assertEqual(by_seq(steps[2])[0]["cells"], list(range(5)))

    def test_fault_probe_off(self):
        w = self.worker(["probe_off"])
        steps, _ = w.trial([decode(0, 1)], setup=setup(5), observe=LOGITS)
        self.assertGreaterEqual(steps[-1]["logits_probe"][0]["max_abs_diff"], 0.5e-2)

    def test_fault_raise_in_trim(self):
        w = self.worker(["raise_in_trim"])
        steps, end = w.trial([decode(0, 1), rm(0, 2)], setup=setup(5))
        self.assertEqual(len(steps), 1)
        e = end["end"]["end"]
        self.assertEqual((e["end"], e["step"]), ("crashed", 2))
        first, rest = e["message"].split("\n", 1)
        self.assertEqual(first, "exception: RuntimeError: injected fault raise_in_trim: trim raised")
        self.assertIn("Traceback", rest)
        # the worker lives on
        steps, end = w.trial([decode(0, 1)], setup=setup(5), tid=2)
        self.assertEqual(end["end"]["end"], COMPLETED)

    def test_fault_abort_in_trim(self):
        w = self.worker(["abort_in_trim"])
        steps, end = w.trial([decode(0, 1), rm(0, 2)], setup=setup(5))
        self.assertEqual(len(steps), 1)
        self.assertIsNone(end)  # the worker died
        self.assertLess(w.proc.wait(timeout=TIMEOUT), 0)


if __name__ == "__main__":
    unittest.main()
