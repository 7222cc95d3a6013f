"""The step replay (`specsim calibrate replay`): traced simulator steps run on the GPU and
held against the prediction, and the host fit made on them.

Layer: may import `calibrate.tables` and what it may.
"""
