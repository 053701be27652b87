"""Small experiments built from the library's blocks; each module runs with `python -m`."""
