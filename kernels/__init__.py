"""Triton kernels and their launch plans (issue 3). Imports triton only."""
