"""The API server's event loop costs a run charges (`client.frontend`; sim/engine/frontend.py, docs/frontend.md).

Seconds of vLLM's API-server event loop per engine step, per output, per server-sent event and
per request, as `python -m calibrate.frontend.cost` measures them. The field takes the values
or the path of such a measurement file (its `model` section is read), e.g.
`--set client.frontend=validation/frontend_cost_2026-12-04.json`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from core.config_base import Strict


class FrontendCosts(Strict):
    step_s: float = Field(0.0, ge=0)  # per engine step with outputs: the socket read, stats, the handler's round
    output_s: float = Field(0.0, ge=0)  # per output of a step: detokenise, RequestOutput, queue put, stats
    stream_s: float = Field(0.0, ge=0)  # per event: reasoning parser, chunk, JSON, SSE write
    stream_s_per_token: float = Field(0.0, ge=0)  # per event, per token the stream generated before it
    first_output_s: float = Field(0.0, ge=0)  # a request's first output: the detokeniser's prompt prefill ...
    first_output_s_per_prompt_token: float = Field(0.0, ge=0)  # ... fixed and per prompt token
    first_stream_s: float = Field(0.0, ge=0)  # a request's first events beyond one: the role chunk
    finish_s: float = Field(0.0, ge=0)  # a request's last events beyond one: finish, usage, [DONE], clean-up
    intake_s: float = Field(0.0, ge=0)  # a new request before its tokenisation: HTTP, validation, template ...
    intake_s_per_prompt_token: float = Field(0.0, ge=0)
    admit_s: float = Field(0.0, ge=0)  # after it: sampling parameters, engine request, sent to the engine core
    admit_s_per_prompt_token: float = Field(0.0, ge=0)
    output_chunk: int = Field(128, ge=1)  # VLLM_V1_OUTPUT_PROC_CHUNK_SIZE: outputs processed between yields

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, data: Any) -> Any:
        if not isinstance(data, (str, Path)):
            return data
        try:
            return json.loads(Path(data).read_text())["model"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{data}: not a front-end cost file with a 'model' section ({e!r}); "
                             "write one with `python -m calibrate.frontend.cost --out FILE`") from None
