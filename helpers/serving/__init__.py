"""Serving engines measured from the outside (layer: chapter studies; taught in 07_serving): a vLLM
server, one streaming client, a concurrency sweep.

Three modules, read in this order; each imports only the ones before it:

- ``server``: which vLLM fits this device and the server's lifecycle (command, guard process,
  ``/health``, log, stop): sections 1 and 2; the engine's own facts (threads, instruction set,
  KV cache from its log) beside our path's, and vllm-ascend's settings and version pairing: section 3.
- ``client``: one streamed completion and its timings, a level of concurrent requests (or of
  Poisson arrivals), fresh prompts, the metrics of ``vllm bench serve`` with its goodput rule, and
  vLLM's own benchmark run: sections 3 and 4.
- ``study``: what chapter 07 measures (``launch``), the sweep, our own path beside it, users
  served, the tables, the plot and what the chapter records: sections 4 to 6.

The chapter reads every name from here (``from helpers import serving``, then ``serving.launch``).
Each name lives in one of the three modules and the code there looks it up there: a test that
replaces a name replaces it in the module that calls it (``serving.study.find_vllm`` for ``launch``).
"""
from .server import (PYTHON_FILE, UNAVAILABLE_FILE, VLLM_VENV, ServerError, ServingUnavailable,
                     VllmInstall, VllmServer, base_url, check_endpoint, check_tensor_parallel,
                     compile_cache_present, device_count, find_vllm, log_tail, model_for_server,
                     pick_port, port_is_free, probe_python, server_command, start_server, stop_on_error,
                     vllm_fits)
from .client import (DONE, GOOD_SHARE, PERCENTILES, PromptSource, RequestResult, StreamError, as_dict,
                     bench_row, bench_serve_command, check_counts, completion_payload, is_good,
                     min_samples, parse_event, percentile, poisson_arrivals,
                     run_bench_serve, run_level, served_model_id, steady_state, stream_completion,
                     summarize)
from .study import (BENCH_FILE, BENCH_LOG, COMPARISON_COLUMNS, COMPARISON_SHOWN, DEFINITIONS,
                    LEVEL_FIGURES, NO_USERS_RATIO_BASELINE, NO_USERS_RATIO_BOUND, NO_USERS_RATIO_MISSING,
                    OURS_04, RATE_COLUMNS, SWEEP_COLUMNS, USERS_COLUMNS, VLLM_AT_04, VLLM_SWEEP, Launch,
                    bench_vs_client, check_parameters, comparison_table, connect, contention,
                    figure_name, goodput_rule, launch, lengths_from_shape, lengths_of, matched_specs,
                    measure_level, measure_rate, measure_sweep, no_ratio_reason, our_path_points,
                    ours_within, plot_serving, ratio_spread, record_bench, record_comparison,
                    record_launch, record_levels, record_our_path, record_rate, record_sweep,
                    record_users, requests_for, search_users, users_of_ours, users_ratio, users_row,
                    users_served, users_served_ratio, users_table, users_within_targets)
# The engine's facts and its settings (server), vllm bench serve on every vLLM line and the stop of an
# interrupted level or benchmark (client).
from .server import (ASCEND_TP_TUNING, ASCEND_TUNING, KERNEL_ISA, PREFIX_CACHING_FLAGS, ascend_pairing,
                     ascend_tuning, engine_caveat, engine_differences, last_start, loaded_kernels,
                     our_engine_facts, parse_engine_log, prefix_caching_of, record_engines, vllm_engine_facts,
                     wheel_isa)
from .client import BENCH_OPTIONAL, BENCH_REQUIRED, BenchNotRun, BenchPlan, bench_entry, bench_plan, stop_group
