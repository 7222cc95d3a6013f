"""GPU calibration: real-shape layer tables, whole-step check, step replay and validation.

Layer: the top one; may import `sim`, `policies`, `workloads` and `core`. The table
formats and their interpolation, which the simulator reads too, live in `core`. Inside, the
packages import one way (docs/design.md#layout): `kernels` < `model`, `device` < `executor` <
`tables` < `benches`, `replay`; `frontend` and `carry` stand alone; `calibrate.cli` on top.

Only `calibrate.tables.run`, `calibrate.tables.measure`, `calibrate.model.layers`,
`calibrate.device.timing` and `calibrate.tables.stepcheck` import torch, inside the GPU path;
the rest is pure Python.
"""
