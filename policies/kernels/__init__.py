"""Triton kernels of the GDN state-commit policies (needs torch and triton; the simulator never imports this)."""
