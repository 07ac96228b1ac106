"""PyTorch backend (issue 3): torch tensors -> launch plan -> kernel."""
