"""Runnable demos of the framework; ``examples.tweets`` is the flagship."""
