"""The benchmark client (vLLM's serving benchmark, docs/vllm.md#serving-benchmark).

Requests become ready at their arrival times (all at t = 0 for a closed loop, or from
a Poisson/Gamma process or a trace). `max_concurrency` is a semaphore: a ready
request is sent only while fewer than that many are in flight. A request's clock
starts when it is sent, so time spent behind the semaphore is client-side queueing,
reported apart from the engine's waiting.

`round_trip_s` is the time a request spends outside the engine apart from its prompt's
tokenisation: HTTP both ways, the detokenisation and streaming of a token. It is charged
between the send and the engine's queue, so TTFT and E2E include it once (as the client
measures them) and in a closed loop the next request reaches the engine that long after
the previous one finished. Then the API server tokenises the prompt, `tokenize_s_per_token`
per prompt token, on its one tokeniser thread (vLLM's `AsyncMicrobatchTokenizer` runs a
single-thread executor): requests that arrive together wait for each other there.
docs/guidellm.md#outside-the-engine says where the numbers come from. Where the API server's
event loop is modelled (sim.engine.frontend), a request also waits for that loop before its
tokenisation (HTTP, validation, chat template) and after it (the engine request and its send).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence

import simpy

from sim.engine.frontend import FrontendLoop
from sim.engine.request import Request


class Client:
    def __init__(self, env: simpy.Environment, requests: Sequence[Request], max_concurrency: int | None,
                 send: Callable[[Request], bool], round_trip_s: float = 0.0,
                 tokenize_s_per_token: float = 0.0, frontend: FrontendLoop | None = None) -> None:
        """`send` hands a request to the engine; False means the engine rejected it at once."""
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
        if not round_trip_s >= 0:
            raise ValueError(f"round_trip_s must be >= 0 seconds, got {round_trip_s}")
        if not tokenize_s_per_token >= 0:
            raise ValueError(f"tokenize_s_per_token must be >= 0 seconds, got {tokenize_s_per_token}")
        self.env = env
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.rid))
        self.limit = max_concurrency
        self._send = send
        self.round_trip_s = round_trip_s
        self.tokenize_s_per_token = tokenize_s_per_token
        self.tokenizer = simpy.Resource(env, capacity=1)  # the API server's tokeniser thread, FIFO
        self.frontend = frontend if frontend is not None and frontend.takes_requests else None
        self.in_flight = 0
        self.queue: deque[Request] = deque()  # ready, waiting for a concurrency slot

    def arrivals(self) -> Generator[simpy.Event, None, None]:
        """SimPy process: make each request ready at its arrival time."""
        env = self.env
        for req in self.requests:
            if req.arrival_s > env.now:
                yield env.timeout(req.arrival_s - env.now)
            self.queue.append(req)
            self._pump()

    def _pump(self) -> None:
        limit = self.limit
        while self.queue and (limit is None or self.in_flight < limit):
            req = self.queue.popleft()
            req.send_s = self.env.now
            self.in_flight += 1
            if self.round_trip_s > 0 or self.tokenize_s_per_token > 0 or self.frontend is not None:
                self.env.process(self._deliver(req))
            elif not self._send(req):
                self.in_flight -= 1

    def _deliver(self, req: Request) -> Generator[simpy.Event, None, None]:
        env, front = self.env, self.frontend
        if self.round_trip_s > 0:
            yield env.timeout(self.round_trip_s)
        if front is not None and (done := front.intake(env.now, req.prompt)) > env.now:
            yield env.timeout(done - env.now)
        if self.tokenize_s_per_token > 0:
            with self.tokenizer.request() as turn:
                yield turn
                yield env.timeout(req.prompt * self.tokenize_s_per_token)
        if front is not None and (done := front.admit(env.now, req.prompt)) > env.now:
            yield env.timeout(done - env.now)
        if not self._send(req):
            self.on_done(req)

    def on_done(self, req: Request) -> None:
        """The engine finished (or rejected) a request: release its slot and send the next ready one."""
        self.in_flight -= 1
        self._pump()
