"""Runs and sweeps: one configuration simulated (`specsim run`), grids of them (`specsim sweep`),
the start-up checks, the code version, the sweep's table, and the small subcommands
(`specsim memory`, `specsim model import`, `specsim bench`).

Layer: may import `sim.engine` and `sim.pricing`.
"""
