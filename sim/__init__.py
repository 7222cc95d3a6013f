"""The simulator: engine model, latency models, runs, sweeps, figures and the `specsim` CLI.

Layer: may import `policies`, `workloads` and `core`, never `calibrate`, torch or triton.
Inside, the packages import one way (docs/design.md#layout): `pricing` < `engine` < `runs` <
`figures` < `plan`, `validate`; `sim.cli` and `sim.readme` on top.
"""
