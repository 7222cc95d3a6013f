"""A sweep's figures (`specsim figures`) and the look every figure shares.

Layer: may import `sim.runs`, `sim.engine` and `sim.pricing`.
"""
