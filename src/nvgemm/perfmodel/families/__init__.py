"""Built-in family facts (registered on first use of :mod:`nvgemm.perfmodel.facts`)."""
