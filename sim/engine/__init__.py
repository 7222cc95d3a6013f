"""The engine a run goes through: `sim.engine.core` steps a vLLM-v1-style loop whose scheduler
plans each step over the KV/state pool, prices it through `sim.pricing`, and records it.

Layer: may import `sim.pricing` (and `core`, `policies`, `workloads`).
"""
