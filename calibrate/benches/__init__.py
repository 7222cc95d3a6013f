"""One-off GPU benches beside the tables: our kernels, packaged kernels, FP8, MoE routing,
the profile run's peak.

Layer: may import `calibrate.tables` and what it may.
"""
