"""What runs in and for each GPU worker: its spec, plugins, RMM resource and CUDA context."""
