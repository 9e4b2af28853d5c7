"""experiment package (DESIGN §1)."""
