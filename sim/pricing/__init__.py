"""Step pricing: the latency models (analytic roofline, calibrated tables, their eager-sum and
pipeline pricings) and the tables and host model they read.

Layer: the lowest of `sim`; imports `core`, `policies` and `workloads` only.
"""
