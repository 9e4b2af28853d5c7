"""record package (DESIGN §1)."""
