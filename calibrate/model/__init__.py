"""The model at real shapes: per-GPU shapes, minimum work, the layers with random weights,
and the kernels vLLM picks for each op.

Layer: may import `calibrate.kernels` (and `sim`, `policies`, `workloads`, `core`).
"""
