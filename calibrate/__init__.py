"""GPU calibration: real-shape layer tables, whole-step check, and the interpolation the simulator uses.

Only `calibrate.run`, `calibrate.measure`, `calibrate.layers`, `calibrate.timing` and
`calibrate.stepcheck` import torch, inside the GPU path; the rest is pure Python.
"""
