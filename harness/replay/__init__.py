"""replay package (DESIGN §1)."""
