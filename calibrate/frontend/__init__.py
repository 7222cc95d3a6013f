"""What vLLM's API server spends per request and per step, measured on this CPU.

Layer: imports `core` only.
"""
