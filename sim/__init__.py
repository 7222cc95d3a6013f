"""The simulator: engine model, latency models, runs, sweeps, figures and the `specsim` CLI.

Layer: may import `policies`, `workloads` and `core`, never `calibrate`, torch or triton.
"""
