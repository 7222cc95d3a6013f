"""Deliberate bugs the test suite must catch, and a runner that checks it does.

    python tests/mutations.py            # every mutation
    python tests/mutations.py NAME ...   # some; --list prints them

Each mutation replaces one piece of source text (which must occur exactly once in the
repository's Python sources, wherever a refactor has moved it) in a temporary copy of the
tracked files, then runs the tests that should fail on it. A mutation the tests pass is
MISSED: a hole in the suite. One whose text is no longer found must be rewritten for the
code as it is now. Exit status 0 only when every mutation ran and was caught.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("core", "sim", "policies", "workloads", "calibrate")
TIMEOUT_S = 1200


@dataclass(frozen=True)
class Mutation:
    name: str
    bug: str  # what the mutation breaks, in words
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids or `file -k expr` pieces


MUTATIONS = (
    Mutation("preempt-oldest", "a short pool preempts the oldest running request, not vLLM's newest",
             "            victim = self.running.pop()\n", "            victim = self.running.pop(0)\n",
             ("tests/test_scheduler_vs_vllm.py",)),
    Mutation("boundary-never-freed", "align mode's old state block for a crossed boundary is never given back",
             "        return computed - self.spec > old_end", "        return False",
             ("tests/test_engine_scenarios.py", "-k", "boundary")),
    Mutation("boundary-not-taken", "a block crossing in align mode takes no block for the new state",
             "        extra = pool.boundary_units if cross and req.bound_end < 0 else 0", "        extra = 0",
             ("tests/test_engine_scenarios.py", "-k", "boundary")),
    Mutation("breakdown-lumps-the-api-server", "the API server's time counted as engine queue",
             '            sums["frontend_s"] += engine - send', '            sums["frontend_s"] += 0',
             ("tests/test_validate_breakdown.py",)),
    Mutation("mixed-decodes-ignored", "a mixed step's decodes priced by their decode kernel, not vLLM's chunked path",
             "        if mixed is not None:  # vLLM's chunked path", "        if False:  # vLLM's chunked path",
             ("tests/test_gdn_mixed.py",)),
    Mutation("mixed-decodes-with-speculation", "speculating decodes beside a prefill sent through the chunked path too",
             "if self.gdn_mixed is None or not (b.prefill_seqs and b.decode_seqs) or b.spec_seqs:",
             "if self.gdn_mixed is None or not (b.prefill_seqs and b.decode_seqs):",
             ("tests/test_gdn_mixed.py",)),
    Mutation("sampler-unpriced", "the pipeline pricing leaves out what the requests' sampling adds to the LM head",
             'lm = lat.token_part_us("lm_head", g, rows) + lat.sampler_us(rows)', 'lm = lat.token_part_us("lm_head", g, rows)',
             ("tests/test_sampler_cost.py", "tests/test_calibrate_latency_pipeline.py")),
    Mutation("sampler-smoothed", "the sampler curve made monotone, hiding vLLM's switch from its sort to the Triton kernel at 8 rows",
             "extrapolate=extrapolate,\n                          monotone=False)", "extrapolate=extrapolate,\n                          monotone=True)",
             ("tests/test_sampler_cost.py",)),
    Mutation("sampler-engine-ignored", "engine.sampling ignored: every request takes the checkpoint's generation config",
             'return model_default if self.sampling == "model" else self.sampling', "return model_default",
             ("tests/test_sampler_cost.py",)),
    Mutation("frontend-slices", "every output of a step processed before any stream writes (not slice by slice)",
             "upto = min(outputs, (e.position // chunk + 1) * chunk)", "upto = outputs",
             ("tests/test_frontend.py",)),
    Mutation("frontend-not-fifo", "a job on the API server's loop starts when it arrives, busy or not",
             "start = arrival if arrival > self.free_at else self.free_at", "start = arrival",
             ("tests/test_frontend.py",)),
    Mutation("admission-first-chunk", "the whole-prompt admission check replaced by the first-chunk check",
             "check = pool.units_for(min(total, self.max_model_len)) if self.full_prompt else need",
             "check = need",
             ("tests/test_engine_semantics.py", "-k", "whole_prompt")),
    Mutation("rejection-footprint", "a request's largest footprint counted without its verify tree and lookahead",
             "self.pool.units_for(total + self.verify_positions + self.lookahead) > self.pool.capacity",
             "self.pool.units_for(total) > self.pool.capacity",
             ("tests/test_engine_scenarios.py", "-k", "pool_rejection")),
    Mutation("replay-cache-memory", "the memory model charges replay's cache 25% more than the kernels allocate",
             "return self.model.gdn_layers * self.cache_slots() * per_layer",
             "return self.model.gdn_layers * self.cache_slots() * per_layer * 5 // 4",
             ("tests/test_replay_cache.py",)),
    Mutation("replay-cache-kernel", "the replay kernels allocate m x max_path slots, one path more than defined",
             "        C = cache_slots(flush_interval, max_path)",
             "        C = flush_interval * max_path",
             ("tests/test_replay_cache.py",)),
    Mutation("drafter-widths", "the drafter's later passes (every step model's) use the next depth's node count",
             "return tuple(per[min(d, len(per)) - 1] for d in range(1, draft_depth)) if per else ()",
             "return tuple(per[min(d, len(per) - 1)] for d in range(1, draft_depth)) if per else ()",
             ("tests/test_engine_latency.py", "-k", "drafter_passes")),
    Mutation("solve-one-factor-short", "the fused verify's triangular inverse one factor (I + L^(2^k)) short",
             "NSQ=(min(T, BC) - 1).bit_length(), PENDING",
             "NSQ=(min(T, BC) - 1).bit_length() - 1, PENDING",
             ("tests/test_kernels_triton.py", "-k", "correlated")),
    Mutation("bf16x3-one-part", "a bf16 operand times only the high bf16 part of the float32 one",
             "            out = _bdot(x, hi) + (_bdot(x, mid) + _bdot(x, lo))",
             "            out = _bdot(x, hi)",
             ("tests/test_kernels_triton.py", "-k", "bf16_inputs")),
    Mutation("version-names-only", "the code version hashes file names, not contents",
             'h.update(path.read_bytes() + b"\\0")',
             'h.update(b"\\0")',
             ("tests/test_code_version.py",)),
    Mutation("version-no-tables", "the code version leaves out the calibration tables",
             "files += read_files(root / hw.calibration_dir, models)",
             "files += read_files(root / hw.calibration_dir, models)[:0]",
             ("tests/test_code_version.py",)),
    Mutation("version-no-workloads", "the code version leaves out the workload sources",
             'SOURCE_PACKAGES = ("sim", "core", "policies", "workloads")',
             'SOURCE_PACKAGES = ("sim", "core", "policies")',
             ("tests/test_code_version.py",)),
    Mutation("version-no-configs", "the code version leaves out the model, hardware and policy configs",
             'if p.is_file() and p.parent != configs and "grids" not in p.relative_to(configs).parts]',
             'if False]',
             ("tests/test_code_version.py",)),
    Mutation("point-digest-unchecked", "a point file's digest is not checked on load",
             'if rec.get("digest") != record_digest(rec):',
             "if False:",
             ("tests/test_outputs_atomic.py", "-k", "hand_edited")),
    Mutation("run-not-staged", "specsim run writes straight into --out",
             "        write_outputs(staged.path, cfg, summary, result)",
             "        write_outputs(staged.target, cfg, summary, result)",
             ("tests/test_outputs_atomic.py", "-k", "fails_while_writing")),
    Mutation("group-keeps-finishing-members", "a decode-group member stays to the step that ends it",
             "        self.margin = verify_positions",
             "        self.margin = 0",
             ("tests/test_decode_run.py", "-k", "group_and_runs or hand_made")),
    Mutation("group-async-total", "the decode group plans a member's total without the step in flight",
             "        self.extra = (verify_positions if sync else 2 * verify_positions) + lookahead",
             "        self.extra = verify_positions + lookahead",
             ("tests/test_decode_run.py", "-k", "group_and_runs")),
    Mutation("run-takes-no-blocks", "a decode run's requests grow without taking the pool's blocks",
             "        change = int(net[:plannings].sum())  # the run frees what it took itself: its net only",
             "        change = 0",
             ("tests/test_decode_run.py", "-k", "group_and_runs")),
    Mutation("curve-over-array-rounds", "a curve over an array interpolated in another (rounding) order",
             "        return (lo + (v[i + 1] - lo) * ((x - t0) / (t[i + 1] - t0))) * scale",
             "        w = (x - t0) / (t[i + 1] - t0)\n        return (lo * (1 - w) + v[i + 1] * w) * scale",
             ("tests/test_decode_run.py", "-k", "curve or pipeline_prices")),
    Mutation("gaps-across-requests", "the inter-token gaps keep the gap from one request to the next",
             "        across = np.cumsum(part)[:-1] - 1",
             "        across = np.cumsum(part)[:-1]",
             ("tests/test_step_loop.py", "-k", "gaps")),
    Mutation("guidellm-duration-from-zero", "guidellm's duration counted from the run's start, not the first send",
             "    return float(_times(sent, \"send_s\").min()), max(ends)",
             "    return 0.0, max(ends)",
             ("tests/test_guidellm_client.py", "-k", "windows")),
    Mutation("guidellm-token-rate-over-duration", "guidellm's token throughputs taken over the duration",
             "            out[f\"output_throughput_{suffix}\"] = span_rate(out_tokens, first.min(), last_chunk.max())",
             "            out[f\"output_throughput_{suffix}\"] = span_rate(out_tokens, begin, end)",
             ("tests/test_guidellm_client.py", "-k", "windows")),
    Mutation("guidellm-untimed-token-rates-compared", "token throughputs compared where only the answers were timed",
             "    **{k: k for k in _COUNTS},",
             "    **{k: k for k in _TOTALS},",
             ("tests/test_guidellm_client.py", "-k", "every_token_was_timed")),
    Mutation("run-freezes-the-heap", "the engine loop freezes what exists instead of resting the collector",
             "    gc.disable()\n    try:\n        env.run()",
             "    gc.freeze()\n    try:\n        env.run()",
             ("tests/test_step_loop.py", "-k", "collector")),
    Mutation("one-request-fits-unchecked", "a pool that cannot hold one request of max_model_len is simulated",
             "    if need <= pool.capacity:\n        return",
             "    if True:\n        return",
             ("tests/test_bad_input.py", "-k", "no_request_can_fit or longest_fit or max_model_len")),
    Mutation("slice-drops-its-prefix-factor", "a slice's values lose the out-of-grid factor of its leading coordinates",
             "        return self._combine(s.log_corners, s.lin_corners, j) * s.scale",
             "        return self._combine(s.log_corners, s.lin_corners, j)",
             ("tests/test_calibrate_interp.py", "-k", "slice")),
    Mutation("stream-seed-hash", "the streams' seeds hashed with another constant than SeedSequence's",
             "INIT_B, MULT_B = 0x8B51F9DD, 0x58F38DED",
             "INIT_B, MULT_B = 0x8B51F9DD, 0x58F38DEE",
             ("tests/test_stream_seeds.py",)),
    Mutation("accept-all-depths-lost", "a verify that accepts every depth counted as accepting none",
             "        accept = np.zeros((steps, depth + 1), bool)",
             "        accept = np.ones((steps, depth + 1), bool)",
             ("tests/test_engine_acceptance.py", "-k", "reference or d_uniforms")),
    # ------------------------------------- inputs vLLM refuses at start-up, or that mean nothing
    Mutation("tp-heads-unchecked", "a tensor-parallel size that does not divide the attention heads is served",
             "    if a.num_q_heads % tp:",
             "    if False:",
             ("tests/test_startup_checks.py", "-k", "tensor_parallel")),
    Mutation("kv-heads-unchecked", "KV heads that do not divide the query heads are accepted",
             "        if self.num_q_heads % self.num_kv_heads:",
             "        if False:",
             ("tests/test_startup_checks.py", "-k", "kv_heads_must_divide")),
    Mutation("mtp-layers-split", "num_speculative_tokens that runs an MTP layer stack in part is accepted",
             "    if k > n > 0 and k % n:",
             "    if False:",
             ("tests/test_startup_checks.py", "-k", "mtp_layers_whole")),
    Mutation("kernel-cap-unchecked", "a tree larger than the TreeWY kernels take is priced as if it ran",
             "    if cap is not None and policy.kernel_positions() > cap:",
             "    if False:",
             ("tests/test_startup_checks.py", "-k", "treewy_kernels or million")),
    Mutation("kernel-cap-exclusive", "the kernels' 128 positions refused as if the limit were 127",
             "    if cap is not None and policy.kernel_positions() > cap:",
             "    if cap is not None and policy.kernel_positions() >= cap:",
             ("tests/test_startup_checks.py", "-k", "kernel_limit_is_inclusive")),
    Mutation("replay-cache-not-verified", "replay's replayed cache left out of the positions its verify runs over",
             "        return self.cache_slots() + self.verify_positions",
             "        return self.verify_positions",
             ("tests/test_startup_checks.py", "-k", "treewy_kernels")),
    Mutation("tree-over-token-budget", "a verify one position over the token budget is accepted",
             "    if policy.verify_positions > tokens:",
             "    if policy.verify_positions > tokens + 1:",
             ("tests/test_startup_checks.py", "-k", "token_budget")),
    Mutation("seqs-over-token-budget", "max_num_seqs above max_num_batched_tokens is served",
             "    if seqs is not None and seqs > tokens:",
             "    if False:",
             ("tests/test_startup_checks.py", "-k", "more_sequences")),
    Mutation("align-block-over-budget", "prefix caching with a token budget below one attention block is served",
             "        if block > tokens:",
             "        if False:",
             ("tests/test_startup_checks.py", "-k", "one_block")),
    Mutation("acceptance-extrapolated", "drafts deeper than the built-in acceptance's fit are priced",
             "    if \"\" not in workload.acceptance and tree.depth > REFERENCE_DEPTH:",
             "    if False:",
             ("tests/test_startup_checks.py", "-k", "deeper_than")),
    Mutation("all-rejected-by-length", "a max_model_len below every request runs and rejects them all",
             "    if shortest > model.max_model_len:",
             "    if False:",
             ("tests/test_startup_checks.py", "-k", "below_every_request")),
    Mutation("tree-without-drafts", "policy none with a draft tree drops the tree silently",
             '        if self.mamba_state_commit == "none" and "draft_tree_widths" in self.model_fields_set:',
             "        if False:",
             ("tests/test_startup_checks.py", "-k", "no_speculation_with_a_tree")),
    Mutation("grid-tree-for-none", "a grid's tree is given to the policy that does not speculate",
             "            if TREE_FIELD in assignment and not drafts(assignment.get(\"policy\", RunConfig().policy)):",
             "            if False:",
             ("tests/test_startup_checks.py", "-k", "speculating_policies_tree")),
    Mutation("measure-window-any", "a warm-up and cool-down that leave one request measured are accepted",
             "        if self.warmup_fraction + self.cooldown_fraction > MAX_EXCLUDED:",
             "        if self.warmup_fraction + self.cooldown_fraction >= 1:",
             ("tests/test_startup_checks.py", "-k", "warm_up")),
    Mutation("memory-gmu-without-gpu", "specsim memory takes --gmu without a GPU to take it of",
             "    if args.gmu is not None and args.hardware is None:",
             "    if False:",
             ("tests/test_startup_checks.py", "-k", "gmu_needs_hardware")),
    Mutation("missing-tables-roofline", "a calibration_dir that does not exist is priced by the roofline",
             "    if hw.calibration_dir is not None and not (REPO_ROOT / hw.calibration_dir).is_dir():",
             "    if False:",
             ("tests/test_startup_checks.py", "-k", "calibration_folder")),
    Mutation("empty-out-is-cwd", "--out '' writes into the current folder",
             "    if not text.strip():",
             "    if False:",
             ("tests/test_startup_checks.py", "-k", "empty_out")),
    Mutation("plan-rates-crossed", "a plan whose --min-rate is above --max-rate probes before it refuses",
             "        if a > b:",
             "        if False:",
             ("tests/test_startup_checks.py", "-k", "rates_are_crossed")),
    Mutation("sweep-grid-replaced", "a sweep of another grid replaces a folder's points.csv",
             "    if json.dumps(same, sort_keys=True) != json.dumps(identity, sort_keys=True, default=str):",
             "    if False:",
             ("tests/test_outputs_atomic.py", "-k", "another_grid")),
    Mutation("sweep-points-unchecked", "a sweep runs a grid with a point vLLM would refuse",
             "        check_points(configs)  # and a configuration vLLM would refuse\n",
             "",
             ("tests/test_startup_checks.py", "-k", "refused_point")),
    Mutation("yaml-duplicate-keys", "a YAML key given twice keeps the last value",
             "            if key in seen:",
             "            if False:",
             ("tests/test_yaml_strict.py",)),
    Mutation("lax-types", "true, '5' and 1 taken for a number, a number and a boolean",
             '    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)',
             '    model_config = ConfigDict(extra="forbid", frozen=True)',
             ("tests/test_yaml_strict.py",)),
    Mutation("import-counts-unchecked", "specsim model import takes zero, negative or fractional counts",
             "    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:",
             "    if False:",
             ("tests/test_model_import.py", "-k", "not_positive_integers")),
    Mutation("one-request-unwarned", "a run whose statistics cover one request says nothing",
             "    if len(window) == 1:",
             "    if False:",
             ("tests/test_run_warnings.py",)),
    Mutation("some-rejected-unwarned", "a run that rejected some of its requests says nothing",
             '           "the others"] if rejected else []',
             '           "the others"] if False else []',
             ("tests/test_run_warnings.py",)),
    Mutation("all-rejected-unwarned", "a run that rejected every request says nothing",
             "    if rejected and sum(rejected.values()) == len(requests):",
             "    if False:",
             ("tests/test_run_warnings.py",)),
    Mutation("preempting-step-admits", "a step that preempted still admits waiting requests",
             "            self.memory_blocked_steps += 1  # nobody is admitted this step: memory was short\n            return plan",
             "            self.memory_blocked_steps += 1  # nobody is admitted this step: memory was short",
             ("tests/test_engine_semantics.py", "-k", "preempts_admits")),
    # ------------------------------------------------ behaviours the suite once let through
    Mutation("max-seqs-one-over", "the engine admits one request over max_num_seqs",
             "        while waiting and budget > 0 and len(running) < self.max_seqs:",
             "        while waiting and budget > 0 and len(running) <= self.max_seqs:",
             ("tests/test_engine_scenarios.py", "-k", "max_num_seqs")),
    Mutation("verify-needs-spare-token", "a budget of exactly the verify positions cannot verify the whole draft",
             "                if vp <= budget:",
             "                if vp < budget:",
             ("tests/test_engine_semantics.py", "-k", "exactly_the_verify")),
    Mutation("one-token-verify", "a draft cut to one token still counted as a verify",
             "                    spec = n > 1",
             "                    spec = True",
             ("tests/test_engine_semantics.py", "-k", "cut_to_one")),
    Mutation("slo-bound-strict", "a metric exactly at its SLO bound counted as breaking it",
             "        return v is not None and v <= self.bound_s",
             "        return v is not None and v < self.bound_s",
             ("tests/test_plan_search.py", "-k", "at_its_bound")),
    Mutation("verdict-from-short-run", "a probe's verdict read from its short run, not the confirming one",
             "        violated = tuple(s.name for s in self.slos if not s.met(b) or s in growing)",
             "        violated = tuple(s.name for s in self.slos if not s.met(a) or s in growing)",
             ("tests/test_plan_search.py", "-k", "longer_runs")),
    Mutation("sharegpt-prompt-limit-exclusive", "ShareGPT's filter drops a prompt of exactly 1,024 tokens",
             "                and prompt <= self.max_prompt_tokens and prompt + output <= self.max_total_tokens)",
             "                and prompt < self.max_prompt_tokens and prompt + output <= self.max_total_tokens)",
             ("tests/test_workloads_sharegpt.py", "-k", "limit_keeps")),
    Mutation("sampler-rows-unbounded", "the dummy sampler runs max_num_seqs rows above the token budget",
             "    rows = min(max_seqs, max_tokens)  # one dummy request per row, at most one token each",
             "    rows = max_seqs",
             ("tests/test_memory_pool.py", "-k", "dummy_sampler")),
    Mutation("random-prompt-no-template", "guidellm's synthetic prompts without the chat template's tokens",
             "    requests = [RequestSpec(request_id=i, prompt_tokens=prompt_tokens + template_tokens, output_tokens=output_tokens)",
             "    requests = [RequestSpec(request_id=i, prompt_tokens=prompt_tokens, output_tokens=output_tokens)",
             ("tests/test_prompt_sizes.py",)),
    Mutation("client-prompt-no-template", "a guidellm client's prompt size without the chat template's tokens",
             '            return self.dataset.prompt_tokens + (CHAT_TEMPLATE_TOKENS if self.client.tool == "guidellm" else 0)',
             "            return self.dataset.prompt_tokens",
             ("tests/test_prompt_sizes.py",)),
    Mutation("report-git-unknown", "report.md outside a git checkout says git unknown, not what made it",
             "f\"`{manifest.get('package', 'gdn-specsim')}`, outside a git checkout\"),",
             "\"git `unknown`\"),",
             ("tests/test_figures_report.py", "-k", "outside_a_checkout")),
    Mutation("figures-without-pricing", "a figure's footnote leaves out which pricing made its points",
             "    added = \" \".join(t for t in (not_run_note(df), pricing_note(df)) if t)",
             "    added = not_run_note(df)",
             ("tests/test_figures_report.py", "-k", "outside_a_checkout")),
    # -------------------------------------------------- faults: a killed or interrupted sweep
    Mutation("workers-outlive-parent", "a sweep's pool workers keep running after their parent was SIGKILLed",
             "        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)",
             "        pass",
             ("tests/test_sweep_signals.py", "-k", "sigkill")),
    Mutation("workers-take-ctrl-c", "pool workers take Ctrl-C themselves (each idle one prints a traceback)",
             "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n",
             "",
             ("tests/test_sweep_signals.py", "-k", "ctrl_c")),
    Mutation("dead-owner-lock-kept", "a lock whose recorded owner is dead refuses every later sweep",
             "if holder and not owner_running(holder):",
             "if False:",
             ("tests/test_sweep_signals.py", "-k", "dead_is_taken")),
    Mutation("lock-inherited-by-fork", "a forked worker keeps a descriptor of its parent's folder lock",
             "os.register_at_fork(after_in_child=_close_in_child)",
             "pass",
             ("tests/test_sweep_signals.py", "-k", "forked_child")),
    Mutation("throughput-mode-not-doubled", "--performance-mode throughput leaves vLLM's default limits as they are",
             "THROUGHPUT_SCALE = 2",
             "THROUGHPUT_SCALE = 1",
             ("tests/test_performance_mode.py", "-k", "doubles")),
    Mutation("throughput-mode-doubles-set-limits", "throughput mode doubles a max_num_seqs the user set",
             "seqs = engine.max_num_seqs if engine.max_num_seqs is not None else hw.max_num_seqs * scale",
             "seqs = (engine.max_num_seqs or hw.max_num_seqs) * scale",
             ("tests/test_performance_mode.py", "-k", "by_hand")),
    Mutation("defaulted-seqs-uncapped", "a defaulted max_num_seqs is not capped at the token budget",
             "        seqs = min(seqs, tokens)",
             "        seqs = seqs",
             ("tests/test_performance_mode.py", "-k", "capped")),
    Mutation("interactivity-coarse-graphs", "interactivity mode captures the balanced sizes",
             "if performance_mode == \"interactivity\" else (1, 2, 4)",
             "if False else (1, 2, 4)",
             ("tests/test_performance_mode.py", "-k", "every_size")),
    Mutation("engine-ignores-performance-mode", "the engine captures the balanced sizes in every mode",
             "                                                     scheduler.verify_positions, performance_mode=performance_mode),",
             "                                                     scheduler.verify_positions),",
             ("tests/test_performance_mode.py", "-k", "pads_to")),
    Mutation("replay-ignores-performance-mode", "a traced step's batch is rebuilt with the balanced sizes",
             "    vp, depth, sizes, full_ok = step_shape(model, policy, engine.max_num_seqs, engine.max_num_batched_tokens,\n"
             "                                           engine.performance_mode)",
             "    vp, depth, sizes, full_ok = step_shape(model, policy, engine.max_num_seqs, engine.max_num_batched_tokens)",
             ("tests/test_performance_mode.py", "-k", "pads_to")),
    Mutation("validate-acceptance-misnamed", "validation.json names another source as a case's acceptance",
             "                \"acceptance_source\": summary[\"acceptance_source\"],",
             "                \"acceptance_source\": summary[\"latency_source\"],",
             ("tests/test_validate_real.py", "-k", "speculating")),
    Mutation("faster-of-takes-the-new-run", "calibrate merge --faster-of keeps the merged run's row whatever it timed",
             'elif float(fresh[key(r)]["us"]) < float(r["us"]):', "elif True:",
             ("tests/test_calibrate_merge.py",)),
    Mutation("merge-drops-host-ops", "a host table's ops the merged run did not measure are dropped, not kept",
             'keep = [row for row in old_rows if row["op"] not in new_ops]', "keep = []",
             ("tests/test_calibrate_merge.py",)),
    Mutation("moe-smem-one-b-tile", "a fused-MoE launch's shared memory counted with one B tile, so oversized ones are tried",
             "gate_up = a + 2 * cfg.block_k * cfg.block_n", "gate_up = a + cfg.block_k * cfg.block_n",
             ("tests/test_calibrate_moe_configs.py",)),
    Mutation("reprice-any-step", "re-pricing a replay accepts a regenerated steps file whose step differs",
             "if any(int(float(r[k])) != v for k, v in shape.items()):", "if False:",
             ("tests/test_calibrate_replay.py", "-k", "repricing")),
    Mutation("prefill-conv-unpriced", "the GDN prefill's causal conv left out of a step without a varlen table",
             "chunked)\n                    + lat.prefill_conv_us(b.prefill_tokens))", "chunked))",
             ("tests/test_calibrate_latency_pipeline.py", "-k", "varlen")),
    Mutation("prefill-conv-scaled-twice", "a derived GPU's prefill conv, priced at its own copy rate, scaled again",
             "return (lat.derived_factor(0.0) * lat.curve_us(\"gdn_prefill\", \"graph\", chunked)",
             "return lat.derived_factor(0.0) * (lat.curve_us(\"gdn_prefill\", \"graph\", chunked)",
             ("tests/test_calibrate_latency_pipeline.py", "-k", "copy_rate")),
    Mutation("pricing-imports-engine", "the step pricing imports the engine above it (a package against the table)",
             "from sim.pricing.latency import LatencyModel\n\nENGINE_FIELDS",
             "from sim.pricing.latency import LatencyModel\nfrom sim.engine.pool import Pool  # noqa: F401\n\nENGINE_FIELDS",
             ("tests/test_layering.py", "-k", "packages_inside")),
    Mutation("engine-part-from-outside", "a run reaches into the engine's scheduler instead of its entry point",
             "from sim.engine.core import EngineResult, run_engine",
             "from sim.engine.core import EngineResult, run_engine\nfrom sim.engine.scheduler import Scheduler  # noqa: F401",
             ("tests/test_layering.py", "-k", "entered_through")),
)


def tracked_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)


def locate(root: Path, text: str) -> list[Path]:
    """Each source file once per occurrence of `text` in it."""
    hits = [(p, p.read_text().count(text)) for d in SOURCE_DIRS for p in sorted((root / d).rglob("*.py"))]
    return [p for p, n in hits for _ in range(n)]


def run(m: Mutation, root: Path) -> str:
    where = locate(root, m.old)
    if len(where) != 1:
        return f"STALE ({len(where)} places hold its text; rewrite it for today's code)"
    path = where[0]
    original = path.read_text()
    path.write_text(original.replace(m.old, m.new))
    try:
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *m.tests],
                              cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"UNDECIDED (the tests ran past {TIMEOUT_S} s)"
    finally:
        path.write_text(original)
    if proc.returncode == 1:
        return f"caught ({path.relative_to(root)})"
    if proc.returncode == 0:
        return f"MISSED ({path.relative_to(root)}: the tests pass with the bug)"
    return f"ERROR (pytest exit {proc.returncode}): {proc.stdout[-400:]}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="mutations to run (default: all)")
    p.add_argument("--list", action="store_true", help="print the mutations and exit")
    args = p.parse_args()
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    if unknown := set(args.names) - {m.name for m in MUTATIONS}:
        print(f"unknown mutation(s) {', '.join(sorted(unknown))}; --list shows them", file=sys.stderr)
        return 2
    if args.list:
        for m in chosen:
            print(f"{m.name:28} {m.bug}\n{'':28} tests: {' '.join(m.tests)}")
        return 0
    ok = True
    with tempfile.TemporaryDirectory(prefix="specsim-mutations-") as tmp:
        root = Path(tmp)
        tracked_copy(root)
        for m in chosen:
            result = run(m, root)
            ok &= result.startswith("caught (")
            print(f"{m.name:28} {result}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
