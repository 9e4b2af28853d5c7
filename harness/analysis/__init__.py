"""analysis package (DESIGN §1)."""
