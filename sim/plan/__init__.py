"""The planner (`specsim plan`): the highest request rate each configuration sustains under SLOs.

Layer: may import `sim.figures`, `sim.runs`, `sim.engine` and `sim.pricing`.
"""
