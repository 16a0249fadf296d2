"""What ``mindwatch runs`` and ``mindwatch tail`` print in a terminal (rich tables, a live view)."""
