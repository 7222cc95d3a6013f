"""GPU calibration: real-shape layer tables, whole-step check and validation.

Layer: the top one; may import `sim`, `policies`, `workloads` and `core`. The table
formats and their interpolation, which the simulator reads too, live in `core`.

Only `calibrate.run`, `calibrate.measure`, `calibrate.layers`, `calibrate.timing` and
`calibrate.stepcheck` import torch, inside the GPU path; the rest is pure Python.
"""
