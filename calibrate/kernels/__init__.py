"""The calibrator's fused layer kernels (Triton) and their plain-PyTorch references (`naive.py`)."""
