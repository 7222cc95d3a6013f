"""The table measurement (`specsim calibrate measure / merge / validate`): the layer tables,
host.csv, the whole-step check.

Layer: may import `calibrate.executor`, `calibrate.model`, `calibrate.device`,
`calibrate.kernels`.
"""
