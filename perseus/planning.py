"""Placeholder: the planning adapter lands with the generic solver."""
