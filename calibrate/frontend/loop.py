"""One engine step's work on vLLM's API-server event loop, timed with vLLM 0.17.1's own code.

What runs is what docs/frontend.md lists, on one uvloop event loop as `vllm serve` runs it:
  - the engine core's outputs arrive on a ZMQ socket and are decoded with vLLM's
    `MsgpackDecoder(EngineCoreOutputs)` (`AsyncMPClient.process_outputs_socket`);
  - AsyncLLM's output handler (`AsyncLLM._run_output_handler`, reproduced: it is a closure
    over an engine client) hands them to vLLM's `OutputProcessor.process_outputs` in slices of
    `VLLM_V1_OUTPUT_PROC_CHUNK_SIZE` (128) with `asyncio.sleep(0)` between slices; the
    processor detokenises (`FastIncrementalDetokenizer`, Qwen3.5's fast tokenizer), builds each
    `RequestOutput` and puts it in the request's `RequestOutputCollector`; the per-step stats go
    to Prometheus (reproduced with prometheus_client's histograms, as `PrometheusStatLogger.record`
    observes them: it needs a whole VllmConfig);
  - one task per stream runs `AsyncLLM.generate`'s collector loop (reproduced, three lines) under
    vLLM's `OpenAIServingChat.chat_completion_stream_generator` with the qwen3 reasoning parser,
    and encodes each server-sent event as Starlette's StreamingResponse does before its `send`
    (the HTTP write itself is timed on loopback by calibrate/frontend/http_loopback.py).
A step's time runs from the socket read to the last stream's last event of that step.
"""
from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass

CHUNK = 128  # vllm/envs.py VLLM_V1_OUTPUT_PROC_CHUNK_SIZE
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # the inter-token-latency histogram's buckets (vllm/v1/metrics/loggers.py)


@dataclass
class StepTiming:
    total_s: float  # socket read to the last event written
    receive_s: float  # ZMQ read and msgpack decode
    process_s: float  # OutputProcessor.process_outputs, all slices
    stats_s: float  # the per-step Prometheus record
    events: int  # server-sent events the streams wrote


def _serving():
    """vLLM's chat serving object with the settings of `vllm serve --reasoning-parser qwen3` and no
    tools (its constructor needs an engine client; the stream generator reads only these)."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat

    s = object.__new__(OpenAIServingChat)
    s.use_harmony, s.tool_parser, s.enable_auto_tools, s.tool_call_id_type = False, None, False, "random"
    s.enable_force_include_usage, s.enable_log_outputs, s.enable_log_deltas = False, False, True
    s.request_logger, s.enable_prompt_tokens_details, s.response_role = None, False, "assistant"
    return s


class LoopBench:
    """`streams` chat completions in flight on one event loop, fed engine steps one at a time."""

    def __init__(self, tok, prompt: str, output_ids: list[int], streams: int) -> None:
        from prometheus_client import CollectorRegistry, Histogram
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.v1.engine.output_processor import OutputProcessor

        self.tok, self.output_ids, self.n = tok, output_ids, streams
        self.processor = OutputProcessor(tok, log_stats=True, stream_interval=1)
        self.serving = _serving()
        # guidellm streams with usage (the token counts it reports are the server's)
        self.request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": prompt}], stream=True,
                                             stream_options={"include_usage": True}, max_tokens=len(output_ids))
        self.conversation = [{"role": "user", "content": prompt}]
        self.prompt_ids = tok.apply_chat_template(self.conversation, add_generation_prompt=True, tokenize=True)
        reg = CollectorRegistry()
        self.itl = Histogram("itl", "", ["model_name", "engine"], buckets=ITL_BUCKETS, registry=reg).labels("m", "0")
        self.ttft = Histogram("ttft", "", ["model_name", "engine"], buckets=ITL_BUCKETS, registry=reg).labels("m", "0")
        self.e2e = Histogram("e2e", "", ["model_name", "engine"], buckets=ITL_BUCKETS, registry=reg).labels("m", "0")
        self.written = 0
        self.expected = 0
        self.done = asyncio.Event()

    def _add(self, i: int, tag: str):
        from vllm.v1.engine import EngineCoreRequest
        from vllm.v1.engine.output_processor import RequestOutputCollector

        params = self.request.to_sampling_params(len(self.output_ids), {})
        rid = f"chatcmpl-{tag}{i}"
        req = EngineCoreRequest(request_id=rid, prompt_token_ids=list(self.prompt_ids), mm_features=None,
                                sampling_params=params, pooling_params=None, arrival_time=time.time(),
                                lora_request=None, cache_salt=None, data_parallel_rank=None, external_req_id=rid)
        queue = RequestOutputCollector(params.output_kind, rid)
        self.processor.add_request(req, None, None, 0, queue)
        return rid, queue

    async def _stream(self, rid: str, queue) -> None:
        from vllm.entrypoints.openai.engine.protocol import RequestResponseMetadata
        from vllm.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser

        async def generate():  # AsyncLLM.generate's loop over the request's collector
            finished = False
            while not finished:
                out = queue.get_nowait() or await queue.get()
                finished = out.finished
                yield out

        parser = Qwen3ReasoningParser(self.tok, chat_template_kwargs={})
        async for event in self.serving.chat_completion_stream_generator(
                self.request, generate(), rid, "m", self.conversation, self.tok,
                RequestResponseMetadata(request_id=rid), parser):
            event.encode("utf-8")  # Starlette's StreamingResponse, before its send
            self.written += 1
            if self.written == self.expected:
                self.done.set()

    async def run(self, positions: list[int], tag: str) -> list[StepTiming]:
        """Stream `positions` (output token indices; the last one finishes every stream) and
        time each step. Position 0 is the first token: its step writes the role chunk too."""
        import zmq
        import zmq.asyncio
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
        from vllm.v1.metrics.stats import IterationStats, SchedulerStats
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

        reqs = [self._add(i, tag) for i in range(self.n)]
        tasks = [asyncio.create_task(self._stream(rid, q)) for rid, q in reqs]
        await asyncio.sleep(0)
        encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
        path = os.path.join(tempfile.mkdtemp(), "out.ipc")
        ctx, actx = zmq.Context(), zmq.asyncio.Context()
        push, pull = ctx.socket(zmq.PUSH), actx.socket(zmq.PULL)
        pull.bind(f"ipc://{path}")
        push.connect(f"ipc://{path}")
        out = []
        try:
            for k, pos in enumerate(positions):
                last = k == len(positions) - 1
                step = EngineCoreOutputs(outputs=[
                    EngineCoreOutput(request_id=rid, new_token_ids=[self.output_ids[pos]],
                                     finish_reason=FinishReason.LENGTH if last else None)
                    for rid, _ in reqs], scheduler_stats=SchedulerStats(num_running_reqs=self.n), timestamp=time.monotonic())
                # events a stream writes: role + delta first, finish + usage + [DONE] last
                self.expected = self.written + self.n * ((2 if pos == 0 else 1) + (2 if last else 0))
                self.done.clear()
                push.send_multipart(encoder.encode(step), copy=False)
                await asyncio.sleep(0.002)  # the message is in the socket before the clock starts
                out.append(await self._step(pull, decoder, IterationStats))
        finally:
            push.close(0)
            pull.close(0)
            ctx.term()
            await asyncio.gather(*tasks)
        return out

    async def _step(self, pull, decoder, iteration_stats_cls) -> StepTiming:
        clock = time.perf_counter
        t0 = clock()
        outputs = decoder.decode(await pull.recv_multipart(copy=False))
        t1 = clock()
        stats = iteration_stats_cls()
        items, process = outputs.outputs, 0.0
        for start in range(0, len(items), CHUNK):
            end = start + CHUNK
            a = clock()
            self.processor.process_outputs(items[start:end], outputs.timestamp, stats)
            process += clock() - a
            if end < len(items):
                await asyncio.sleep(0)
        a = clock()
        self.processor.update_scheduler_stats(outputs.scheduler_stats)
        self._record(stats)
        stats_s = clock() - a
        await self.done.wait()
        return StepTiming(clock() - t0, t1 - t0, process, stats_s, self.expected)

    def _record(self, stats) -> None:
        """PrometheusStatLogger.record's per-step observations."""
        for ttft in stats.time_to_first_tokens_iter:
            self.ttft.observe(ttft)
        for itl in stats.inter_token_latencies_iter:
            self.itl.observe(itl)
        for finished in stats.finished_requests:
            for _ in range(5):  # e2e, queue, prefill, inference, decode time per finished request
                self.e2e.observe(finished.e2e_latency)


def time_steps(tok, prompt: str, output_ids: list[int], streams: int, positions: list[int],
               tag: str) -> list[StepTiming]:
    import uvloop

    async def main():
        return await LoopBench(tok, prompt, output_ids, streams).run(positions, tag)

    return uvloop.run(main())
