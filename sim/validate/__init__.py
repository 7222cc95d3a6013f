"""Validation against published vLLM runs (`specsim validate`): the cases, what each
benchmark client prints, and the comparison.

Layer: may import `sim.figures`, `sim.runs`, `sim.engine` and `sim.pricing`.
"""
