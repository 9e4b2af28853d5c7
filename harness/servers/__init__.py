"""servers package (DESIGN §1)."""
