"""What a request is on every wire: the typed messages between processes, the one intake (GenerateRequest), sampling
parameters, results and their formats (torch-free)."""
