"""Pieces shared by the kernel families: workspaces, the derived-tensor memo, the run-time occupancy query."""
