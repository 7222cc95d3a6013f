"""vLLM's own scheduler against the simulator's (needs vLLM's Python code; see lockstep.py)."""
