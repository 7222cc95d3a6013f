"""The bottom layer: what every other package shares and nothing of ours lies under.

`core.config` (the YAML schema of models, hardware, policies, engine and runs),
`core.tables` and `core.interp` (calibration table formats and their interpolation,
read by the simulator and written by the calibrator), `core.files` (atomic writes).
Imports only the standard library and third-party packages: never `policies`,
`workloads`, `sim` or `calibrate`.
"""
