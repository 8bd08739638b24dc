"""Task families that produce training nodes and score completions."""
