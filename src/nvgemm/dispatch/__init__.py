"""Dispatch: the backend registry every op kind selects from, the first-use self-check and the serving plan."""
