"""Tests of workers/python_ref.py, run as kvaudit runs it: a subprocess spoken to in JSON lines.

    python3 -m unittest workers/test_python_ref.py -v
"""

import json
import os
import queue
import subprocess
import sys
import threading
import unittest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_ref.py")
TIMEOUT = 10.0


class Worker:
    """A running python_ref.py: send requests, read replies with a timeout."""

    def __init__(self, faults=(), hello=True):
        self.proc = subprocess.Popen(
            [sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        self.lines, self.stderr = queue.Queue(), []
        threading.Thread(target=self._pump, daemon=True).start()
        # Standard error is drained so that a chatty worker never blocks on a full pipe.
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()
        self.hello = None
        if hello:
            self.send({"hello": {"protocol": 1, "faults": list(faults), "options": {}}})
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
        """Runs a trial; returns (steps, end) where steps are the step bodies."""
        self.send({"trial": {
            "id": tid,
            "setup": setup if setup is not None else {"n_ctx": 16, "n_seq_max": 2, "ops": []},
            "ops": ops, "seqs": list(seqs),
            "observe": observe or {"before": False, "whole": False, "round_trip": False,
                                   "logits": False}}})
        steps = []
        while True:
            reply = self.recv()
            if reply is None or "end" in reply or "error" in reply:
                return steps, reply
            self.assertion_id(reply["step"], tid)
            steps.append(reply["step"])

    @staticmethod
    def assertion_id(body, tid):
        if body["id"] != tid:
            raise AssertionError("reply for id %r, expected %r" % (body["id"], tid))

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


def decode(seq, n, **kw):
    return dict({"op": "decode", "seq": seq, "n": n}, **kw)


def by_seq(step):
    return {o["seq"]: o for o in step["seqs"]}


ALL = {"before": True, "whole": True, "round_trip": True, "logits": False}


class PythonRefTest(unittest.TestCase):
    def worker(self, faults=(), hello=True):
        w = Worker(faults, hello)
        self.addCleanup(w.close)
        return w

    def test_hello_declares_the_capabilities(self):
        w = self.worker()
        h = w.hello["hello"]
        self.assertEqual((h["protocol"], h["engine"]), (1, "python-ref"))
        caps = h["capabilities"]
        self.assertNotIn("seq_div", caps["ops"])
        self.assertIn("position division", caps["lacks"]["seq_div"])
        self.assertEqual(caps["cells_from"], "state")
        for k in ("accessors", "before", "whole", "round_trip"):
            self.assertIs(caps[k], True, k)
        self.assertIs(caps["logits"], False)
        self.assertEqual(caps["max_seqs"], 64)

    def test_unknown_fault_and_malformed_requests_are_errors(self):
        w = self.worker(hello=False)
        w.send({"hello": {"protocol": 1, "faults": ["no_such_fault"], "options": {}}})
        self.assertIn("unknown fault", w.recv()["error"]["message"])
        w.send({"hello": {"protocol": 1, "faults": [], "options": {}}})
        self.assertIn("hello", w.recv())
        w.proc.stdin.write(b"not json\n")
        w.proc.stdin.flush()
        self.assertIn("error", w.recv())
        _, end = w.trial([], setup={"n_ctxx": 16}, tid=3)
        self.assertEqual(end["error"]["id"], 3)
        self.assertIn("n_ctxx", end["error"]["message"])
        _, end = w.trial([{"op": "seq_rm", "seq": 0, "p0": 0}], tid=4)
        self.assertIn("error", end)
        # A setup op that does not take effect is a harness error, not a trial.
        _, end = w.trial([], setup={"n_ctx": 4, "n_seq_max": 2, "ops": [decode(0, 5)]}, tid=5)
        self.assertIn("did not take effect", end["error"]["message"])
        w.send({"bye": {}})
        self.assertIsNone(w.recv())
        self.assertEqual(w.proc.wait(timeout=TIMEOUT), 0)

    def test_decode_and_seq_rm_give_the_right_cells(self):
        w = self.worker()
        setup = {"n_ctx": 16, "n_seq_max": 2, "ops": [decode(0, 4)]}
        steps, end = w.trial([{"op": "seq_rm", "seq": 0, "p0": 2, "p1": -1}, decode(0, 1),
                              {"op": "seq_cp", "src": 0, "dst": 1, "p0": 1, "p1": -1},
                              {"op": "seq_add", "seq": 1, "p0": 0, "p1": -1, "delta": -2}],
                             setup=setup, observe=ALL, tid=7)
        self.assertEqual(end, {"end": {"id": 7, "end": {"end": "completed"}}})
        self.assertEqual([s["step"] for s in steps], [1, 2, 3, 4])
        s1, s2, s3, s4 = steps
        self.assertEqual(s1["outcome"], {"outcome": "done", "returned": True})
        self.assertEqual(by_seq(s1)[0], {"seq": 0, "pos_min": 0, "pos_max": 1, "cells": [0, 1]})
        self.assertEqual(by_seq(s1)[1], {"seq": 1, "pos_min": -1, "pos_max": -1, "cells": []})
        self.assertEqual(s1["before"][0]["cells"], [0, 1, 2, 3])
        self.assertEqual(s2["outcome"], {"outcome": "decoded", "rc": 0})
        self.assertEqual(by_seq(s2)[0]["cells"], [0, 1, 2])
        self.assertEqual(by_seq(s3)[1]["cells"], [1, 2])
        self.assertEqual(s3["whole"], [{"pos": 0, "seqs": [0]}, {"pos": 1, "seqs": [0, 1]},
                                       {"pos": 2, "seqs": [0, 1]}])
        # seq_add moves shared cells for both sequences; the one pushed below 0 is removed.
        self.assertEqual(by_seq(s4)[0]["cells"], [0, 0])
        self.assertEqual(by_seq(s4)[1]["cells"], [0])
        rt = s4["round_trip"]
        self.assertTrue(rt["whole_loaded"] and rt["whole_same_bytes"])
        self.assertEqual(rt["whole_twin"], s4["seqs"])
        self.assertTrue(all(r["loaded"] and r["same_bytes"] for r in rt["seqs"]))
        self.assertEqual([r["twin"] for r in rt["seqs"]], s4["seqs"])

    def test_decode_return_codes(self):
        w = self.worker()
        steps, _ = w.trial([decode(0, 17), decode(2, 1), {"op": "decode", "seqs": [], "n": 1},
                            decode(0, 3, pos=5, tokens=[9, 8, 7]),
                            {"op": "decode", "seqs": [0, 1], "n": 2}])
        self.assertEqual([s["outcome"]["rc"] for s in steps], [1, -1, -1, 0, 0])
        self.assertEqual(by_seq(steps[0])[0]["cells"], [])
        self.assertEqual(by_seq(steps[4])[0]["cells"], [5, 6, 7, 8, 9])
        self.assertEqual(by_seq(steps[4])[1]["cells"], [8, 9])

    def test_stale_max_makes_pos_max_disagree_with_the_cells(self):
        w = self.worker(["stale_max"])
        steps, _ = w.trial([{"op": "seq_rm", "seq": 0, "p0": 2, "p1": -1}],
                           setup={"n_ctx": 16, "n_seq_max": 2, "ops": [decode(0, 4)]})
        obs = by_seq(steps[0])[0]
        self.assertEqual(obs["cells"], [0, 1])
        self.assertEqual(obs["pos_max"], 3)  # I1: pos_max is not the largest cell

    def test_keep_leaks_leaves_another_sequence_behind(self):
        setup = {"n_ctx": 16, "n_seq_max": 2, "ops": [decode(0, 3), decode(1, 2)]}
        for faults, leaked in (((), []), (("keep_leaks",), [0, 1])):
            w = self.worker(faults)
            steps, _ = w.trial([{"op": "seq_keep", "seq": 0}], setup=setup)
            self.assertEqual(by_seq(steps[0])[0]["cells"], [0, 1, 2])
            self.assertEqual(by_seq(steps[0])[1]["cells"], leaked, faults)

    def test_load_drops_last_changes_the_round_trip_twin(self):
        setup = {"n_ctx": 16, "n_seq_max": 2, "ops": [decode(0, 3)]}
        w = self.worker(["load_drops_last"])
        steps, _ = w.trial([decode(1, 1)], setup=setup, observe=ALL)
        rt = steps[0]["round_trip"]
        self.assertEqual(by_seq(steps[0])[0]["cells"], [0, 1, 2])  # observations are intact
        self.assertFalse(rt["whole_same_bytes"])
        self.assertNotEqual(rt["whole_twin"], steps[0]["seqs"])
        self.assertEqual(rt["seqs"][0]["twin"]["cells"], [0, 1])
        self.assertFalse(rt["seqs"][0]["same_bytes"])
        # An empty cache round-trips without a crash (there is no last cell to drop).
        steps, end = w.trial([{"op": "clear"}], setup=setup, observe=ALL, tid=2)
        self.assertEqual(end["end"]["end"], {"end": "completed"})
        self.assertTrue(steps[0]["round_trip"]["whole_same_bytes"])

    def test_raise_on_clear_ends_crashed_with_the_traceback(self):
        w = self.worker(["raise_on_clear"])
        steps, end = w.trial([decode(0, 2), {"op": "clear"}], tid=9)
        self.assertEqual(len(steps), 1)
        e = end["end"]["end"]
        self.assertEqual((end["end"]["id"], e["end"], e["step"]), (9, "crashed", 2))
        self.assertTrue(e["message"].startswith("RuntimeError"), e["message"])
        self.assertIn("Traceback", e["message"])
        self.assertIn("in clear", e["message"])
        # The worker lives on and runs the next trial.
        _, end = w.trial([decode(0, 1)], tid=10)
        self.assertEqual(end["end"]["end"], {"end": "completed"})

    def test_abort_on_clear_kills_the_process(self):
        w = self.worker(["abort_on_clear"])
        steps, end = w.trial([{"op": "clear"}])
        self.assertEqual((steps, end), ([], None))
        self.assertNotEqual(w.proc.wait(timeout=TIMEOUT), 0)

    def test_hang_on_clear_does_not_answer(self):
        w = self.worker(["hang_on_clear"])
        w.send({"trial": {"id": 1, "setup": {"n_ctx": 16, "n_seq_max": 2},
                          "ops": [{"op": "clear"}], "seqs": [0]}})
        with self.assertRaises(queue.Empty):
            w.recv(timeout=1.0)
        w.proc.kill()

    def test_settings_it_cannot_honour_are_unsupported(self):
        w = self.worker()
        for extra in ({"arch": "gemma2"}, {"kv_unified": False}, {"swa_full": False},
                      {"n_rs_seq": 2}, {"embd_input": True}, {"n_seq_max": 65},
                      {"foreign": [{"slot": "a", "config": "type_k=f32"}]}):
            setup = dict({"n_ctx": 16, "n_seq_max": 2, "ops": []}, **extra)
            steps, end = w.trial([decode(0, 1)], setup=setup)
            self.assertEqual(steps, [], extra)
            self.assertEqual(end["end"]["end"]["end"], "unsupported", extra)
            self.assertEqual(end["end"]["end"]["step"], 0, extra)
        # Settings that do not change a positional model are accepted.
        setup = {"n_ctx": 16, "n_seq_max": 2, "type_k": "q8_0", "type_v": "q8_0",
                 "flash_attn": True, "n_batch": 8, "n_ubatch": 2, "arch": "llama", "ops": []}
        _, end = w.trial([decode(0, 1)], setup=setup)
        self.assertEqual(end["end"]["end"], {"end": "completed"})

    def test_seq_div_is_unsupported(self):
        w = self.worker()
        steps, end = w.trial([decode(0, 4), {"op": "seq_div", "seq": 0, "p0": 0, "p1": 4, "d": 2},
                              decode(0, 1)])
        self.assertEqual(len(steps), 2)
        self.assertEqual(steps[1]["outcome"]["outcome"], "unsupported")
        self.assertEqual(end["end"]["end"]["end"], "unsupported")
        self.assertEqual(end["end"]["end"]["step"], 2)

    def test_a_damaged_load_fails_cleanly(self):
        w = self.worker()
        setup = {"n_ctx": 16, "n_seq_max": 2, "ops": [decode(0, 3), decode(1, 2)]}
        steps, end = w.trial([
            {"op": "state_seq_save", "seq": 0, "slot": "a"},
            {"op": "state_save", "slot": "w"},
            decode(0, 1),
            {"op": "state_seq_load", "seq": 0, "slot": "a", "truncate": 12},
            {"op": "state_seq_load", "seq": 0, "slot": "a", "flip": 20},
            {"op": "state_load", "slot": "w", "truncate": 30},
            {"op": "state_load", "slot": "w", "flip": 9},
            {"op": "state_seq_load", "seq": 1, "slot": "nothing"},
            {"op": "state_seq_load", "seq": 1, "slot": "a"},
            {"op": "state_load", "slot": "w", "flip": 100000},
        ], setup=setup, observe=ALL)
        self.assertEqual(end["end"]["end"], {"end": "completed"})
        for s in steps[3:7]:
            self.assertEqual(s["outcome"], {"outcome": "done", "returned": False}, s["step"])
            self.assertEqual(s["seqs"], s["before"], s["step"])
        self.assertEqual(steps[7]["outcome"]["outcome"], "refused")
        # An intact sequence load replaces the destination's cells.
        self.assertEqual(steps[8]["outcome"], {"outcome": "done", "returned": True})
        self.assertEqual(by_seq(steps[8])[1]["cells"], [0, 1, 2])
        self.assertEqual(by_seq(steps[8])[0]["cells"], [0, 1, 2, 3])
        # A flip past the end damages nothing: the whole state saved at step 2 comes back.
        self.assertEqual(steps[9]["outcome"], {"outcome": "done", "returned": True})
        self.assertEqual(steps[9]["seqs"], steps[1]["seqs"])
        # An empty sequence's dump loads (true) and leaves the destination as it was.
        steps, _ = w.trial([{"op": "state_seq_save", "seq": 1, "slot": "e"},
                            {"op": "state_seq_load", "seq": 0, "slot": "e"}],
                           setup={"n_ctx": 16, "n_seq_max": 2, "ops": [decode(0, 3)]}, tid=2)
        self.assertEqual(steps[1]["outcome"], {"outcome": "done", "returned": True})
        self.assertEqual(by_seq(steps[1])[0]["cells"], [0, 1, 2])


if __name__ == "__main__":
    unittest.main()
