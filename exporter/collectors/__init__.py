"""Collectors: one per source, each turns readings into contract samples."""
