"""The GPU machine's package carry (`make carry`): pinned wheels into `.carry-a/`, `.carry-b/`.

Layer: imports nothing of the project.
"""
