"""Framework backends: thin launchers over the kernels' launch plans."""
