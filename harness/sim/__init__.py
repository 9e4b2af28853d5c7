"""sim package (DESIGN §1)."""
