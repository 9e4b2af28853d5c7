"""report package (DESIGN §1)."""
