"""The HTTP side of vLLM's API server, on loopback: per request and per server-sent event.

A uvicorn server as `vllm serve` starts one (uvloop, httptools) runs a FastAPI app with the
middleware vLLM's `build_app` installs by default (CORS, vLLM's `ScalingMiddleware`) and a chat
completions route that, like vLLM's `create_chat_completion` router, takes vLLM's
`ChatCompletionRequest` (FastAPI parses and validates the body) and returns a Starlette
`StreamingResponse` of `data: ...` events. The engine and the serving code are left out (the
events are prebuilt): what is timed is what this process does around them. A client process
streams `requests` requests `concurrency` at a time; the server process's CPU time (user +
system, from /proc) over two runs with few and many events per request separates the cost per
request from the cost per event.
"""
import asyncio
import json
import multiprocessing as mp
import os
import socket
import time

EVENT = ('data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"m","choices":'
         '[{"index":0,"delta":{"reasoning":" token"},"logprobs":null,"finish_reason":null}]}\n\n')


def _app(events_per_request: dict):
    from fastapi import FastAPI
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.responses import StreamingResponse
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.serve.elastic_ep.middleware import ScalingMiddleware

    app = FastAPI()

    # (no postponed annotations in this module: FastAPI reads the parameter's type to parse the body)
    @app.post("/v1/chat/completions")
    async def create_chat_completion(request: ChatCompletionRequest):
        async def events():
            for _ in range(request.max_tokens):
                yield EVENT
            yield "data: [DONE]\n\n"

        return StreamingResponse(content=events(), media_type="text/event-stream")

    # vllm/entrypoints/openai/api_server.py build_app: CORS with its defaults, then ScalingMiddleware
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=False, allow_methods=["*"],
                       allow_headers=["*"])
    app.add_middleware(ScalingMiddleware)
    return app


def _serve(sock: socket.socket) -> None:
    import uvicorn

    config = uvicorn.Config(_app({}), loop="uvloop", http="httptools", log_level="error", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _one(port: int, body: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 + f"content-length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    events = 0
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            break
        events += (await reader.readexactly(size + 2)).count(b"data: ")
    writer.close()
    return events


async def _load(port: int, prompt: str, requests: int, concurrency: int, events: int) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}], "stream": True,
                       "stream_options": {"include_usage": True}, "max_tokens": events}).encode()
    gate = asyncio.Semaphore(concurrency)

    async def bounded():
        async with gate:
            got = await _one(port, body)
        if got != events + 1:
            raise RuntimeError(f"a stream brought {got} events of {events + 1}")

    await asyncio.gather(*(bounded() for _ in range(requests)))


def _client(port: int, prompt: str, requests: int, concurrency: int, events: int) -> None:
    asyncio.run(_load(port, prompt, requests, concurrency, events))


def measure_http(prompt: str, requests: int = 400, concurrency: int = 64, events=(2, 50), reps: int = 3) -> dict:
    """Server CPU seconds per request and per event (each the fastest of `reps` pairs of runs)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    server = ctx.Process(target=_serve, args=(sock,), daemon=True)
    server.start()
    try:
        _wait_up(port)
        _client(port, prompt, 20, 4, 2)  # warm-up: imports, route compilation
        cpu: dict[int, list[float]] = {e: [] for e in events}
        for _ in range(reps):
            for e in events:
                before = _cpu_s(server.pid)
                client = ctx.Process(target=_client, args=(port, prompt, requests, concurrency, e))
                client.start()
                client.join()
                if client.exitcode:
                    raise RuntimeError("the loopback client failed")
                cpu[e].append((_cpu_s(server.pid) - before) / requests)
    finally:
        server.terminate()
        server.join()
    few, many = events
    best = {e: min(v) for e, v in cpu.items()}
    per_event = (best[many] - best[few]) / (many - few)
    return {"per_request_s": best[few] - (few + 1) * per_event, "per_event_s": per_event,
            "requests": requests, "concurrency": concurrency, "events_per_request": list(events),
            "cpu_s_per_request": {str(e): v for e, v in cpu.items()}}


def _wait_up(port: int, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the loopback server did not start")
