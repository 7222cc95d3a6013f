"""Service-level objectives for `specsim plan`: `--slo ttft_p99=2s`, `--slo tpot_mean=50ms`.

A name is a latency metric and a statistic, in either order and with vLLM's serving
benchmark spellings (`p99_ttft`, `mean_tpot`, `median_itl`, `e2el`): metric ttft, tpot,
itl or e2el; statistic mean, median, p90 or p99 (the statistics the run's summary
holds, sim.engine.metrics). The bound is an upper bound with a unit (s, ms, us); a metric
meets it when its value is at most the bound.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from core.config import ConfigError
from sim.engine.metrics import PERCENTILES

METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e", "e2e": "e2e"}  # name -> summary prefix
STATS = ("mean", *PERCENTILES)
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_BOUND = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Zµ]*)\s*$")


@dataclass(frozen=True)
class Slo:
    name: str  # canonical: metric_stat, e.g. ttft_p99
    key: str  # the run summary's field, e.g. ttft_p99_s
    bound_s: float

    def value(self, summary: dict[str, Any]) -> float | None:
        v = summary.get(self.key)
        return None if v is None else float(v)

    def met(self, summary: dict[str, Any]) -> bool:
        v = self.value(summary)
        return v is not None and v <= self.bound_s

    def __str__(self) -> str:
        return f"{self.name} <= {format_seconds(self.bound_s)}"


def format_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def valid_names() -> list[str]:
    return [f"{m}_{s}" for m in ("ttft", "tpot", "itl", "e2el") for s in STATS]


def _split_name(name: str) -> tuple[str, str] | None:
    parts = name.lower().split("_")
    if len(parts) != 2:
        return None
    a, b = parts
    if a in METRICS and b in STATS:
        return a, b
    if b in METRICS and a in STATS:
        return b, a
    return None


def parse_slo(text: str) -> Slo:
    """`NAME=VALUEUNIT` -> Slo; a bad name, value or unit raises ConfigError naming what is allowed."""
    name, sep, bound = text.partition("=")
    if not sep:
        raise ConfigError(f"--slo expects NAME=BOUND with a unit, e.g. ttft_p99=2s or tpot_mean=50ms; got {text!r}")
    parsed = _split_name(name.strip())
    if parsed is None:
        raise ConfigError(f"--slo {text}: unknown metric {name.strip()!r}; valid: {', '.join(valid_names())} "
                          f"(statistic first also works: p99_ttft)")
    metric, stat = parsed
    m = _BOUND.match(bound)
    if not m:
        raise ConfigError(f"--slo {text}: the bound must be a positive number with a unit "
                          f"({', '.join(UNITS)}), e.g. 2s or 50ms; got {bound!r}")
    number, unit = float(m.group(1)), m.group(2)
    if unit not in UNITS:
        problem = f"unknown unit {unit!r}" if unit else "the bound needs a unit"
        raise ConfigError(f"--slo {text}: {problem}; valid: {', '.join(UNITS)}")
    if number <= 0:
        raise ConfigError(f"--slo {text}: the bound must be > 0")
    label = "e2el" if metric in ("e2e", "e2el") else metric
    return Slo(f"{label}_{stat}", f"{METRICS[metric]}_{stat}_s", number * UNITS[unit])


def parse_slos(texts: list[str]) -> list[Slo]:
    slos = [parse_slo(t) for t in texts]
    if not slos:
        raise ConfigError("give at least one --slo, e.g. --slo ttft_p99=2s --slo tpot_mean=50ms")
    names = [s.name for s in slos]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"--slo names {', '.join(dup)} more than once; give each metric one bound")
    return slos
