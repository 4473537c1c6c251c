"""``better-compute agent``: the node agent run on each GPU host (Hello, heartbeats, device health)."""
