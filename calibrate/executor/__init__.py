"""The step executor: the whole model on one GPU running steps the way vLLM does.

Layer: may import `calibrate.model`, `calibrate.device` and `calibrate.kernels`.
"""
