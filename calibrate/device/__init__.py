"""Timing on the GPU (CUDA-graph replay, eager launches), graph capture, and the provenance
of a measurement.

Layer: may import `sim`, `policies`, `workloads` and `core`.
"""
