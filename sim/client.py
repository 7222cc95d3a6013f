"""The benchmark client (vLLM's serving benchmark, DESIGN.md section 5).

Requests become ready at their arrival times (all at t = 0 for a closed loop, or from
a Poisson/Gamma process or a trace). `max_concurrency` is a semaphore: a ready
request is sent only while fewer than that many are in flight. A request's clock
starts when it is sent, so time spent behind the semaphore is client-side queueing,
reported apart from the engine's waiting.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence

import simpy

from sim.request import Request


class Client:
    def __init__(self, env: simpy.Environment, requests: Sequence[Request], max_concurrency: int | None,
                 send: Callable[[Request], bool]) -> None:
        """`send` hands a request to the engine; False means the engine rejected it at once."""
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
        self.env = env
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.rid))
        self.limit = max_concurrency
        self._send = send
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
            if self._send(req):
                self.in_flight += 1

    def on_done(self, req: Request) -> None:
        """The engine finished a request: release its slot and send the next ready one."""
        self.in_flight -= 1
        self._pump()
