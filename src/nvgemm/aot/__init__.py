"""Ahead-of-time kernel artifacts: compile specs and keys, the shim/link of one exported kernel, the on-disk cache."""
