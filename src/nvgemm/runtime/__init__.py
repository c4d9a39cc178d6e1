"""Dispatch at call time: the backend registry, the sm90 / sm100 kernel backends, occupancy queries, the serving plan."""
